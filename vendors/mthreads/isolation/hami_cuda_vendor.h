/*
 * hami_cuda_vendor.h: what libvmusa.so is, for the core's CUDA-compatible hook layer (core/src/hami/isolation/cuda,
 * which holds every driver hook): the MUSA driver API is CUDA's under the mu prefix (muMemAlloc_v2, muLaunchKernel,
 * muGetProcAddress, ...), in libmusa.so.1, with CUDA's result codes and structure layouts (an assumption: MUSA's
 * musa.h is not public; see the README). MTML is not NVML-compatible, so no management-library hook. The MUSA
 * runtime's hooks are the core's CUDA-runtime-shaped layer's (core/src/hami/isolation/rt, hami_rt_vendor.h), which
 * the layer's dlsym, dlvsym and muGetProcAddress answer as well.
 *
 * Moore Threads' own hooks, answered by the layer's dlsym and dlvsym like its own (HAMI_CUDA_VENDOR_HOOKS): the
 * driver's unversioned names (aliases.c). The symbol set is libvmusa.map.
 */
#ifndef HAMI_MTHREADS_CUDA_VENDOR_H
#define HAMI_MTHREADS_CUDA_VENDOR_H

#include <stddef.h>

#define HAMI_CU(suffix) mu##suffix
#define HAMI_CUDA_VENDOR_NAME "mthreads"
#define HAMI_CUDA_DRIVER_LIBRARIES "libmusa.so.1", "/usr/local/musa/lib/libmusa.so.1", "libmusa.so"

/* MUSA_DEVICE_MEMORY_LIMIT[_<i>], MUSA_DEVICE_SM_LIMIT[_<i>], MUSA_DEVICE_MEMORY_SHARED_CACHE, MUSA_OVERSUBSCRIBE,
 * MUSA_TASK_PRIORITY, MUSA_CORE_UTILIZATION_POLICY; the container's GPU UUIDs (MUSA_VISIBLE_DEVICES holds ordinals,
 * not UUIDs) and the log level under names of their own. */
#define HAMI_CUDA_ENV_PREFIX "MUSA"
#define HAMI_CUDA_ENV_VISIBLE_DEVICES "MUSA_DEVICE_UUIDS"
#define HAMI_CUDA_ENV_LOG_LEVEL "LIBVMUSA_LOG_LEVEL"
#define HAMI_CUDA_DEFAULT_CACHE "/tmp/vmusashr.cache"

/* The driver's unversioned names, which a program may bind instead of the _v2 the layer hooks (aliases.c). Declared
 * with the plain types of cuda_api.h (CUresult is int, CUdeviceptr unsigned long long), which is included after this
 * header. */
#define HAMI_MU_ALIASES(X)                                                                                     \
    X(muMemAlloc)                                                                                              \
    X(muMemAllocPitch)                                                                                         \
    X(muMemFree)                                                                                               \
    X(muMemGetInfo)                                                                                            \
    X(muDeviceTotalMem)                                                                                        \
    X(muCtxCreate)

int muMemAlloc(unsigned long long *dptr, size_t bytesize);
int muMemAllocPitch(unsigned long long *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                    unsigned int ElementSizeBytes);
int muMemFree(unsigned long long dptr);
int muMemGetInfo(size_t *free, size_t *total);
int muDeviceTotalMem(size_t *bytes, int dev);
struct CUctx_st;
int muCtxCreate(struct CUctx_st **pctx, unsigned int flags, int dev);

#define HAMI_CUDA_VENDOR_HOOKS(X) HAMI_MU_ALIASES(X)

#endif /* HAMI_MTHREADS_CUDA_VENDOR_H */
