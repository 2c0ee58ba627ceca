"""hami-vendor-amd: AMD GPUs (Instinct, Radeon) for hami-core.

The hook implementations are in `hami_vendor_amd.plugin`.
"""
