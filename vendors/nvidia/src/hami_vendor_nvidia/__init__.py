"""hami-vendor-nvidia: NVIDIA GPUs for hami-core. The hook implementations are in `hami_vendor_nvidia.plugin`."""
