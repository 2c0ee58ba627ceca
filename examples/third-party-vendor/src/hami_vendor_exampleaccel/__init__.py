"""hami-vendor-exampleaccel: the ExampleAccel device of Example Devices Inc. for hami-core.

An example third-party vendor plugin. The hook implementations are in `hami_vendor_exampleaccel.plugin`;
the node's device list (this made-up device has no driver) is read by `hami_vendor_exampleaccel.inventory`.
"""

__version__ = "0.1.0"
