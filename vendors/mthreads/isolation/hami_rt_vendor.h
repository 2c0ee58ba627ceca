/*
 * hami_rt_vendor.h: what libvmusa.so is, for the core's CUDA-runtime-shaped hook layer (core/src/hami/isolation/rt,
 * which holds every runtime hook), beside the CUDA-compatible layer that hooks the driver (hami_cuda_vendor.h). The
 * MUSA runtime is CUDA's runtime under the musa prefix (musaMalloc, musaFree, musaMemGetInfo, musaLaunchKernel, ...),
 * in libmusart.so (SDK 4 and 5 sonames) under /usr/local/musa/lib; its result codes are CUDA's (musaSuccess 0,
 * musaErrorInvalidValue 1, musaErrorMemoryAllocation 2, musaErrorInitializationError 3, musaErrorNotSupported 801:
 * the CUDA runtime's values, an assumption, musa_runtime_api.h not being public). Why the runtime is hooked too: it
 * reaches the driver through the private table muGetExportTable hands it, not through the mu* exports, so a program
 * using musaMalloc or musaLaunchKernel (torch_musa does) would never meet the driver hooks. It has memory pools
 * (musaMallocFromPoolAsync) and none of HIP's extras. Its one optional launch is musaLaunchKernelExC, the runtime's
 * launch-config launch (what CUDA's cudaLaunchKernelEx template lowers to): its signature and its launch-config struct
 * are CUDA's by the mirror parity, cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
 * void **args) and cudaLaunchConfig_t (dim3 gridDim; dim3 blockDim; size_t dynamicSmemBytes; the stream; the
 * attributes' pointer; unsigned numAttrs), unverified against the SDK's musa_runtime_api.h (not public). Unhooked, it
 * would be a launch that reaches the driver through the private table, around the compute limit; hooked, it passes
 * the limiter as musaLaunchKernel does. The variables are the driver layer's (MUSA_*), so both layers configure the
 * core alike, whichever is called first; the symbol set is libvmusa.map.
 */
#ifndef HAMI_MTHREADS_RT_VENDOR_H
#define HAMI_MTHREADS_RT_VENDOR_H

#define HAMI_RT(suffix) musa##suffix
#define HAMI_RT_PREFIX "musa"
#define HAMI_RT_VENDOR_NAME "mthreads"
#define HAMI_RT_LIBRARIES                                                                                      \
    "libmusart.so", "libmusart.so.5", "libmusart.so.4", "libmusart.so.1.5", "/usr/local/musa/lib/libmusart.so"

#define HAMI_RT_ENV_MEMORY_LIMIT "MUSA_DEVICE_MEMORY_LIMIT"
#define HAMI_RT_ENV_CORE_LIMIT "MUSA_DEVICE_SM_LIMIT"
#define HAMI_RT_ENV_SHARED_CACHE "MUSA_DEVICE_MEMORY_SHARED_CACHE"
#define HAMI_RT_DEFAULT_CACHE "/tmp/vmusashr.cache"
#define HAMI_RT_ENV_OVERSUBSCRIBE "MUSA_OVERSUBSCRIBE"
#define HAMI_RT_ENV_PRIORITY "MUSA_TASK_PRIORITY"
#define HAMI_RT_ENV_POLICY "MUSA_CORE_UTILIZATION_POLICY"
#define HAMI_RT_ENV_LOG_LEVEL "LIBVMUSA_LOG_LEVEL"
#define HAMI_RT_ENV_UUIDS "MUSA_DEVICE_UUIDS"

#define HAMI_RT_ERROR_NOT_SUPPORTED 801 /* musaErrorNotSupported, CUDA's value */
#define HAMI_RT_HAS_HIP_EXTRAS 0
#define HAMI_RT_HAS_POOL 1
#define HAMI_RT_HAS_LAUNCH_EXC 1 /* musaLaunchKernelExC, CUDA's signature by the mirror parity */

#endif /* HAMI_MTHREADS_RT_VENDOR_H */
