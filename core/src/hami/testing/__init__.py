"""What vendor plugin authors test with: the conformance kit (`hami.testing.conformance`).

    from hami.testing.conformance import VendorFixture, RequestCase, pytest_suite
    test_conformance = pytest_suite(lambda: VendorFixture(name="myvendor", plugin=my_plugin_module, ...))

Fakes for the node side (a fake kubelet) join this package with the node daemon.
"""
