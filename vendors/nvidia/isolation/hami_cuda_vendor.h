/*
 * hami_cuda_vendor.h: what libvgpu.so is, for the core's CUDA-compatible hook layer (core/src/hami/isolation/cuda,
 * which holds every hook): NVIDIA's CUDA driver and NVML under their own names, and HAMi-core's variables.
 * The symbol set is libvgpu.map.
 */
#ifndef HAMI_NVIDIA_CUDA_VENDOR_H
#define HAMI_NVIDIA_CUDA_VENDOR_H

#define HAMI_CU(suffix) cu##suffix
#define HAMI_CUDA_VENDOR_NAME "nvidia"
#define HAMI_CUDA_DRIVER_LIBRARIES "libcuda.so.1"
#define HAMI_CUDA_NVML_LIBRARIES "libnvidia-ml.so.1"

/* HAMi-core's names (the device plugin sets them), not all of the form CUDA_*. */
#define HAMI_CUDA_ENV_PREFIX "CUDA"
#define HAMI_CUDA_ENV_POLICY "GPU_CORE_UTILIZATION_POLICY"
#define HAMI_CUDA_ENV_LOG_LEVEL "LIBCUDA_LOG_LEVEL"
#define HAMI_CUDA_ENV_VISIBLE_DEVICES "NVIDIA_VISIBLE_DEVICES"
#define HAMI_CUDA_DEFAULT_CACHE "/tmp/cudevshr.cache"

#endif /* HAMI_NVIDIA_CUDA_VENDOR_H */
