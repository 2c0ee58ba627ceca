"""The unified node daemon (`hami node`): one process per node serving every installed vendor's devices.

    devices   what discovery found, turned into the device IDs the kubelet is told about
    plugin    one device-plugin gRPC server per resource (`grpc.aio`, a unix socket), ListAndWatch pushes
    kubelet   registration with the kubelet's `kubelet.sock`, and noticing when the kubelet restarts
    simulated devices read from an inventory file instead of the vendors' drivers (`hami demo`, trials)
    register  the node annotations the scheduler reads (register, handshake), written when they change
    allocate  the kubelet's Allocate: which pod, which devices, the vendor's edits, annotations, the node lock
    pods      pods this node served: their containers for the monitor, `hami_release` when they finish
    hooklib   installing the vendors' isolation libraries on the host: versioned builds, atomic switches
    monitor   Prometheus metrics with HAMi's node-side names, on their own port
    daemon    the assembly: settings, the event loop, periodic work, SIGTERM
    cli       `hami node` and its flags (`python -m hami.node` runs the same without the `hami` command)
    proto     the device-plugin API v1beta1: the `.proto` and its generated stubs

Importing this package imports nothing else: vendors and tools may read its constants cheaply.
"""
