"""What vendor plugin authors test with.

- `hami.testing.conformance`: the named checks every vendor runs against a fixture it provides::

      from hami.testing.conformance import VendorFixture, RequestCase, pytest_suite
      test_conformance = pytest_suite(lambda: VendorFixture(name="myvendor", plugin=my_plugin_module, ...))

- `hami.testing.kubelet`: a fake kubelet (a real Registration server on a unix socket, and a client that calls a
  device plugin exactly as the kubelet does) to drive the node daemon with.
- `hami.testing.apiserver`: a small Kubernetes API server on loopback over an in-memory cluster (`MemoryCluster`),
  reached through a kubeconfig like a real one: what the demo runs on and what tests of API clients talk to.
- `hami.testing.sandbox`: the isolation library's test sandbox (the installed library in front of fake vendor
  libraries compiled with the C sources of ``csrc/``), configured by one `IsolationSetup` per vendor::

      SETUP = IsolationSetup(package="hami_vendor_myvendor", library="libvmy.so", fakes=..., client=..., ...)
      build, sandbox = fixtures(SETUP)

- `hami.testing.cuda`: the test kit of a library on the core's CUDA-compatible hook layer (fake CUDA-compatible
  driver and NVML-compatible library, the client's CUDA side, the hooked functions, `cuda_isolation_setup`).
- `hami.testing.isolation`: the isolation checks every vendor runs in its sandbox (`CrashTests`, `StartupTests`)
  and the device-time share measurement; `hami.testing.isolation_benchmark`: the library overhead benchmark.
- `hami.testing.backstop`: the node-side backstop's checks over a vendor's fake management library
  (`BackstopTests`, with a `backstop_node` fixture giving a `BackstopNode`; the fake's per-process call reads the
  process table of ``csrc/fake_processes.h``).
- `hami.testing.readings`: the device readings' checks over a vendor's fake management library (`ReadingsTests`,
  with a `readings_node` fixture giving a `ReadingsNode`; the fake's reading calls answer from the figures of
  ``csrc/fake_readings.h``), and `scrape`, the node monitor's families over a plugin host.
"""
