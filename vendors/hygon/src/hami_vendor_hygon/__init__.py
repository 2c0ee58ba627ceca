"""hami-vendor-hygon: Hygon DCUs for hami-core. The hook implementations are in `hami_vendor_hygon.plugin`."""
