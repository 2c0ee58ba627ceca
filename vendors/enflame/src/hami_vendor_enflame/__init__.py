"""hami-vendor-enflame: Enflame GCUs (whole cards and DRS partitions) for hami-core.

The hook implementations are in `hami_vendor_enflame.plugin`.
"""
