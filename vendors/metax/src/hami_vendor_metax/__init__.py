"""hami-vendor-metax: MetaX GPUs for hami-core. The hook implementations are in `hami_vendor_metax.plugin`."""
