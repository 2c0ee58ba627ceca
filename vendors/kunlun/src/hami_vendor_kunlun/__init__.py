"""hami-vendor-kunlun: Kunlunxin XPUs for hami-core (HAMi's scheduler side; the node side is Kunlunxin's plugin).

The hook implementations are in `hami_vendor_kunlun.plugin`.
"""
