"""Kubernetes Dynamic Resource Allocation (resource.k8s.io/v1) for every installed vendor, beside the device plugins.

* `hami.dra.slices`: the node's devices as one ResourceSlice (from the same discovery hooks as the device
  plugins), with the share policy each vendor's `hami_dra_device` allows, and its publishing through the API;
* `hami.dra.claims`: reading an allocated ResourceClaim back into HAMi placements (device, memory, cores);
* `hami.dra.cdi`: the CDI spec files that carry a prepared claim's container edits;
* `hami.dra.plugin`: the kubelet plugin (DRA gRPC `NodePrepareResources` / `NodeUnprepareResources` and the
  kubelet plugin-registry handshake), served by the node daemon when `draDriver` is set;
* `hami.dra.proto`: the kubelet's wire (DRA v1 and plugin registration v1) and the generated stubs.

The node daemon drives all of it; the vendors are reached only through `hami.plugins.VendorPlugins`.
See docs/dra.md.
"""
