"""hami-vendor-mthreads: Moore Threads GPUs for hami-core.

The hook implementations are in `hami_vendor_mthreads.plugin`.
"""
