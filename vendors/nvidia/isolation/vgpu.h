/*
 * vgpu.h: what the sources of libvgpu.so share: the lists of hooked and called driver functions (one place;
 * the real-function table, the dlsym table and the cuGetProcAddress map are all generated from them), the
 * per-thread context cache, and the entry checks every hook starts with.
 */
#ifndef HAMI_NV_VGPU_H
#define HAMI_NV_VGPU_H

#include <stdatomic.h>
#include <stdint.h>

#include "cuda_api.h"
#include "hami_isolation.h"

#define HAMI_EXPORT __attribute__((visibility("default")))
#define HAMI_LIKELY(x) __builtin_expect(!!(x), 1)
#define HAMI_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Every CUDA function libvgpu.so exports and intercepts. Keep libvgpu.map and the tests' list in step. */
#define HAMI_CUDA_HOOKS(X)                                                                                     \
    X(cuInit)                                                                                                  \
    X(cuGetProcAddress)                                                                                        \
    X(cuGetProcAddress_v2)                                                                                     \
    X(cuMemAlloc_v2)                                                                                           \
    X(cuMemAllocPitch_v2)                                                                                      \
    X(cuMemAllocManaged)                                                                                       \
    X(cuMemFree_v2)                                                                                            \
    X(cuMemCreate)                                                                                             \
    X(cuMemRelease)                                                                                            \
    X(cuMemAllocAsync)                                                                                         \
    X(cuMemAllocAsync_ptsz)                                                                                    \
    X(cuMemFreeAsync)                                                                                          \
    X(cuMemFreeAsync_ptsz)                                                                                     \
    X(cuMemAllocFromPoolAsync)                                                                                 \
    X(cuMemAllocFromPoolAsync_ptsz)                                                                            \
    X(cuMemPoolCreate)                                                                                         \
    X(cuMemPoolDestroy)                                                                                        \
    X(cuArrayCreate_v2)                                                                                        \
    X(cuArray3DCreate_v2)                                                                                      \
    X(cuArrayDestroy)                                                                                          \
    X(cuMipmappedArrayCreate)                                                                                  \
    X(cuMipmappedArrayDestroy)                                                                                 \
    X(cuMemGetInfo_v2)                                                                                         \
    X(cuDeviceTotalMem_v2)                                                                                     \
    X(cuLaunchKernel)                                                                                          \
    X(cuLaunchKernel_ptsz)                                                                                     \
    X(cuLaunchKernelEx)                                                                                        \
    X(cuLaunchKernelEx_ptsz)                                                                                   \
    X(cuLaunchCooperativeKernel)                                                                               \
    X(cuLaunchCooperativeKernel_ptsz)                                                                          \
    X(cuGraphLaunch)                                                                                           \
    X(cuGraphLaunch_ptsz)                                                                                      \
    X(cuCtxCreate_v2)                                                                                          \
    X(cuCtxCreate_v3)                                                                                          \
    X(cuCtxCreate_v4)                                                                                          \
    X(cuCtxDestroy_v2)                                                                                         \
    X(cuCtxSetCurrent)                                                                                         \
    X(cuCtxPushCurrent_v2)                                                                                     \
    X(cuCtxPopCurrent_v2)                                                                                      \
    X(cuDevicePrimaryCtxRetain)                                                                                \
    X(cuDevicePrimaryCtxReset_v2)

/* Driver functions libvgpu.so calls without intercepting them. */
#define HAMI_CUDA_CALLS(X)                                                                                     \
    X(cuDeviceGetCount)                                                                                        \
    X(cuCtxGetCurrent)                                                                                         \
    X(cuCtxGetDevice)                                                                                          \
    X(cuEventCreate)                                                                                           \
    X(cuEventRecord)                                                                                           \
    X(cuEventQuery)                                                                                            \
    X(cuEventElapsedTime)                                                                                      \
    X(cuEventSynchronize)                                                                                      \
    X(cuEventDestroy_v2)                                                                                       \
    X(cuStreamIsCapturing)

#define HAMI_NVML_HOOKS(X)                                                                                     \
    X(nvmlDeviceGetMemoryInfo)                                                                                 \
    X(nvmlDeviceGetMemoryInfo_v2)

#define HAMI_NVML_CALLS(X) X(nvmlDeviceGetIndex)

struct hami_nv_real {
#define HAMI_FIELD(name) __typeof__(&name) name;
    HAMI_CUDA_HOOKS(HAMI_FIELD)
    HAMI_CUDA_CALLS(HAMI_FIELD)
    HAMI_NVML_HOOKS(HAMI_FIELD)
    HAMI_NVML_CALLS(HAMI_FIELD)
#undef HAMI_FIELD
};

/* The driver's own functions (NULL when the driver, or that function, is missing). */
extern struct hami_nv_real hami_real;

/* driver.c: loading the real libraries on first use; 1 when loaded, 0 when missing. */
int hami_nv_load_cuda(void);
int hami_nv_load_nvml(void);
extern _Atomic int hami_nv_cuda_state; /* 0 not tried, 1 loaded, -1 missing */
extern _Atomic int hami_nv_nvml_state;

static inline int hami_nv_cuda(void) {
    int state = atomic_load_explicit(&hami_nv_cuda_state, memory_order_acquire);
    return HAMI_LIKELY(state) ? state > 0 : hami_nv_load_cuda();
}

static inline int hami_nv_nvml(void) {
    int state = atomic_load_explicit(&hami_nv_nvml_state, memory_order_acquire);
    return HAMI_LIKELY(state) ? state > 0 : hami_nv_load_nvml();
}

/* Every CUDA hook starts with this: a clean error when the driver or the function is missing. */
#define HAMI_CUDA_ENTER(name)                                                                                  \
    do {                                                                                                       \
        if (HAMI_UNLIKELY(!hami_nv_cuda())) return CUDA_ERROR_NOT_INITIALIZED;                                 \
        if (HAMI_UNLIKELY(!hami_real.name)) return CUDA_ERROR_NOT_FOUND;                                       \
        if (HAMI_UNLIKELY(hami_log_level >= HAMI_LOG_TRACE)) hami_log(HAMI_LOG_TRACE, "%s", #name);             \
    } while (0)

#define HAMI_NVML_ENTER(name)                                                                                  \
    do {                                                                                                       \
        if (HAMI_UNLIKELY(!hami_nv_nvml())) return NVML_ERROR_LIBRARY_NOT_FOUND;                               \
        if (HAMI_UNLIKELY(!hami_real.name)) return NVML_ERROR_FUNCTION_NOT_FOUND;                              \
        if (HAMI_UNLIKELY(hami_log_level >= HAMI_LOG_TRACE)) hami_log(HAMI_LOG_TRACE, "%s", #name);             \
    } while (0)

/* The calling thread's current context and its device, cached; the context hooks invalidate it. */
struct hami_nv_thread {
    CUcontext context;
    int device;
    int valid;
    /* a launch being timed (launch.c) */
    CUevent start, end;
    CUcontext events_context;
    int pending;
    hami_iso_launch launch;
};

extern _Thread_local struct hami_nv_thread hami_nv_tls __attribute__((tls_model("initial-exec")));

int hami_nv_refresh_device(void);

static inline int hami_nv_device(void) {
    if (HAMI_LIKELY(hami_nv_tls.valid)) return hami_nv_tls.device;
    return hami_nv_refresh_device();
}

static inline uint64_t hami_nv_owner(void) {
    (void)hami_nv_device();
    return (uint64_t)(uintptr_t)hami_nv_tls.context;
}

static inline void hami_nv_context_changed(void) { hami_nv_tls.valid = 0; }

/* launch.c */
int hami_nv_stream_capturing(void *stream);

#endif /* HAMI_NV_VGPU_H */
