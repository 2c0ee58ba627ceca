"""hami-vendor-vastai: Vastai accelerators for hami-core (HAMi's scheduler side; the node side is Vastai's plugin).

The hook implementations are in `hami_vendor_vastai.plugin`.
"""
