"""What vendor plugin authors test with.

- `hami.testing.conformance`: the named checks every vendor runs against a fixture it provides::

      from hami.testing.conformance import VendorFixture, RequestCase, pytest_suite
      test_conformance = pytest_suite(lambda: VendorFixture(name="myvendor", plugin=my_plugin_module, ...))

- `hami.testing.kubelet`: a fake kubelet (a real Registration server on a unix socket, and a client that calls a
  device plugin exactly as the kubelet does) to drive the node daemon with.
"""
