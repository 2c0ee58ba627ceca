/*
 * hami_cuda_vendor.h: what libvcorex.so is, for the core's CUDA-compatible hook layer (core/src/hami/isolation/cuda,
 * which holds every hook). Iluvatar CoreX ships a CUDA-compatible driver under CUDA's names (libcuda.so.1, CUDA
 * 10.2-level) and ixML, an NVML-compatible management library (NVML's function names) called libixml.so. ixML is
 * looked for by absolute path first: another project's XML parser is also called libixml.so (the layer passes over
 * any library without nvmlDeviceGetMemoryInfo). The symbol set is libvcorex.map.
 */
#ifndef HAMI_ILUVATAR_CUDA_VENDOR_H
#define HAMI_ILUVATAR_CUDA_VENDOR_H

#define HAMI_CU(suffix) cu##suffix
#define HAMI_CUDA_VENDOR_NAME "iluvatar"
#define HAMI_CUDA_DRIVER_LIBRARIES "libcuda.so.1", "/usr/local/corex/lib64/libcuda.so.1", "/usr/local/corex/lib/libcuda.so.1"
#define HAMI_CUDA_NVML_LIBRARIES                                                                               \
    "/usr/local/corex/lib64/libixml.so", "/usr/local/corex/lib/libixml.so", "libixml.so"

/* IX_DEVICE_MEMORY_LIMIT[_i], IX_DEVICE_SM_LIMIT[_i], IX_DEVICE_MEMORY_SHARED_CACHE, IX_OVERSUBSCRIBE,
 * IX_TASK_PRIORITY, IX_CORE_UTILIZATION_POLICY, IX_LOG_LEVEL; IX_VISIBLE_DEVICES is Iluvatar's own (chip UUIDs). */
#define HAMI_CUDA_ENV_PREFIX "IX"
#define HAMI_CUDA_DEFAULT_CACHE "/tmp/ixdevshr.cache"

#endif /* HAMI_ILUVATAR_CUDA_VENDOR_H */
