"""hami-vendor-ascend: Huawei Ascend NPUs for hami-core. The hook implementations are in `hami_vendor_ascend.plugin`."""
