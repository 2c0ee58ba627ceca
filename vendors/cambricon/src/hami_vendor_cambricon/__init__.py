"""hami-vendor-cambricon: Cambricon MLUs for hami-core.

The hook implementations are in `hami_vendor_cambricon.plugin`.
"""
