"""hami-vendor-iluvatar: Iluvatar CoreX GPUs for hami-core.

The hook implementations are in `hami_vendor_iluvatar.plugin`.
"""
