"""hami-vendor-biren: Biren GPUs (whole cards) for hami-core.

The hook implementations are in `hami_vendor_biren.plugin`.
"""
