/*
 * hami_cuda.h: the CUDA-compatible hook layer, one building block for every vendor whose driver API is CUDA's:
 * the CUDA driver itself, a CUDA-compatible driver shipped as libcuda.so.1, or CUDA's signatures under another
 * prefix (mu*, ...).
 *
 * The layer's sources (driver.c, memory.c, launch.c here) are compiled into the vendor's library together with
 * the C core (../include/hami_isolation.h) when the vendor's LibrarySpec names the layer (layers=("cuda",)). They
 * include the vendor's own `hami_cuda_vendor.h` (in its hooks directory), which says only:
 *
 *   HAMI_CU(suffix)             the vendor's symbol for a CUDA driver function: `cu##suffix` (CUDA's own names),
 *                               `mu##suffix` (another prefix); the layer names every function as HAMI_CU(MemAlloc_v2)
 *   HAMI_CUDA_VENDOR_NAME       "myvendor": written into the accounting file and log lines
 *   HAMI_CUDA_DRIVER_LIBRARIES  "libcuda.so.1": the driver, a list of string literals tried in order
 *   HAMI_CUDA_NVML_LIBRARIES    optional: the NVML-compatible management library (same list form); without it
 *                               no NVML function is hooked
 *   HAMI_CUDA_ENV_PREFIX        "CUDA": the environment variables are <prefix>_DEVICE_MEMORY_LIMIT[_i],
 *                               _DEVICE_SM_LIMIT[_i], _DEVICE_MEMORY_SHARED_CACHE, _OVERSUBSCRIBE, _TASK_PRIORITY,
 *                               _CORE_UTILIZATION_POLICY, _LOG_LEVEL, _VISIBLE_DEVICES; any of them may be named
 *                               instead with HAMI_CUDA_ENV_MEMORY_LIMIT, _CORE_LIMIT, _SHARED_CACHE,
 *                               _OVERSUBSCRIBE, _PRIORITY, _POLICY, _LOG_LEVEL, _VISIBLE_DEVICES
 *   HAMI_CUDA_DEFAULT_CACHE     optional: the accounting file when the variable is unset ("/tmp/<name>shr.cache")
 *   HAMI_CUDA_VENDOR_HOOKS(X)   optional: an X-macro list of the vendor's own hooks (functions the vendor defines
 *                               in further .c files of its hooks directory, declared in this header, e.g. a runtime
 *                               API the driver hooks do not see), answered by dlsym/dlvsym like the layer's; they
 *                               find the real functions with hami_cu_real_symbol() (never dlsym: it is ours)
 *
 * and its version script, which exports the symbol set: `dlsym; dlvsym; dlopen; dlmopen;` and the hooks its driver
 * has. Everything else (the hook table, dlsym/dlvsym/cuGetProcAddress lookups, memory accounting, the limiter's
 * launch accounting) is here, generated from the lists below.
 */
#ifndef HAMI_CUDA_H
#define HAMI_CUDA_H

#include <stdatomic.h>
#include <stdint.h>

#include "hami_cuda_vendor.h"
#include "hami_isolation.h"

#ifndef HAMI_CU
#error "hami_cuda_vendor.h must define HAMI_CU(suffix), the vendor's name of a CUDA driver function"
#endif
#if !defined(HAMI_CUDA_VENDOR_NAME) || !defined(HAMI_CUDA_DRIVER_LIBRARIES)
#error "hami_cuda_vendor.h must define HAMI_CUDA_VENDOR_NAME and HAMI_CUDA_DRIVER_LIBRARIES"
#endif
#if !defined(HAMI_CUDA_ENV_PREFIX)
#define HAMI_CUDA_ENV_PREFIX "CUDA"
#endif
#ifndef HAMI_CUDA_ENV_MEMORY_LIMIT
#define HAMI_CUDA_ENV_MEMORY_LIMIT HAMI_CUDA_ENV_PREFIX "_DEVICE_MEMORY_LIMIT"
#endif
#ifndef HAMI_CUDA_ENV_CORE_LIMIT
#define HAMI_CUDA_ENV_CORE_LIMIT HAMI_CUDA_ENV_PREFIX "_DEVICE_SM_LIMIT"
#endif
#ifndef HAMI_CUDA_ENV_SHARED_CACHE
#define HAMI_CUDA_ENV_SHARED_CACHE HAMI_CUDA_ENV_PREFIX "_DEVICE_MEMORY_SHARED_CACHE"
#endif
#ifndef HAMI_CUDA_ENV_OVERSUBSCRIBE
#define HAMI_CUDA_ENV_OVERSUBSCRIBE HAMI_CUDA_ENV_PREFIX "_OVERSUBSCRIBE"
#endif
#ifndef HAMI_CUDA_ENV_PRIORITY
#define HAMI_CUDA_ENV_PRIORITY HAMI_CUDA_ENV_PREFIX "_TASK_PRIORITY"
#endif
#ifndef HAMI_CUDA_ENV_POLICY
#define HAMI_CUDA_ENV_POLICY HAMI_CUDA_ENV_PREFIX "_CORE_UTILIZATION_POLICY"
#endif
#ifndef HAMI_CUDA_ENV_LOG_LEVEL
#define HAMI_CUDA_ENV_LOG_LEVEL HAMI_CUDA_ENV_PREFIX "_LOG_LEVEL"
#endif
#ifndef HAMI_CUDA_ENV_VISIBLE_DEVICES
#define HAMI_CUDA_ENV_VISIBLE_DEVICES HAMI_CUDA_ENV_PREFIX "_VISIBLE_DEVICES"
#endif
#ifndef HAMI_CUDA_DEFAULT_CACHE
#define HAMI_CUDA_DEFAULT_CACHE "/tmp/" HAMI_CUDA_VENDOR_NAME "shr.cache"
#endif

#ifndef HAMI_CUDA_VENDOR_HOOKS
#define HAMI_CUDA_VENDOR_HOOKS(X) /* none: every hook is the layer's */
#endif

/* A macro argument as a string, after expansion (HAMI_STR(HAMI_CU(Init)) is "cuInit"). */
#define HAMI_STR(x) HAMI_STR_(x)
#define HAMI_STR_(x) #x

#include "cuda_api.h"

#define HAMI_EXPORT __attribute__((visibility("default")))
#define HAMI_LIKELY(x) __builtin_expect(!!(x), 1)
#define HAMI_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Every CUDA function the layer can intercept (by its CUDA name; HAMI_CU gives the vendor's). A vendor's
 * version script exports those its driver has; keep it and the vendor's tests' list in step. */
#define HAMI_CUDA_HOOKS(X)                                                                                         \
    X(HAMI_CU(Init))                                                                                               \
    X(HAMI_CU(GetProcAddress))                                                                                     \
    X(HAMI_CU(GetProcAddress_v2))                                                                                  \
    X(HAMI_CU(MemAlloc_v2))                                                                                        \
    X(HAMI_CU(MemAllocPitch_v2))                                                                                   \
    X(HAMI_CU(MemAllocManaged))                                                                                    \
    X(HAMI_CU(MemFree_v2))                                                                                         \
    X(HAMI_CU(MemCreate))                                                                                          \
    X(HAMI_CU(MemRelease))                                                                                         \
    X(HAMI_CU(MemAllocAsync))                                                                                      \
    X(HAMI_CU(MemAllocAsync_ptsz))                                                                                 \
    X(HAMI_CU(MemFreeAsync))                                                                                       \
    X(HAMI_CU(MemFreeAsync_ptsz))                                                                                  \
    X(HAMI_CU(MemAllocFromPoolAsync))                                                                              \
    X(HAMI_CU(MemAllocFromPoolAsync_ptsz))                                                                         \
    X(HAMI_CU(MemPoolCreate))                                                                                      \
    X(HAMI_CU(MemPoolDestroy))                                                                                     \
    X(HAMI_CU(ArrayCreate_v2))                                                                                     \
    X(HAMI_CU(Array3DCreate_v2))                                                                                   \
    X(HAMI_CU(ArrayDestroy))                                                                                       \
    X(HAMI_CU(MipmappedArrayCreate))                                                                               \
    X(HAMI_CU(MipmappedArrayDestroy))                                                                              \
    X(HAMI_CU(MemGetInfo_v2))                                                                                      \
    X(HAMI_CU(DeviceTotalMem_v2))                                                                                  \
    X(HAMI_CU(LaunchKernel))                                                                                       \
    X(HAMI_CU(LaunchKernel_ptsz))                                                                                  \
    X(HAMI_CU(LaunchKernelEx))                                                                                     \
    X(HAMI_CU(LaunchKernelEx_ptsz))                                                                                \
    X(HAMI_CU(LaunchCooperativeKernel))                                                                            \
    X(HAMI_CU(LaunchCooperativeKernel_ptsz))                                                                       \
    X(HAMI_CU(GraphLaunch))                                                                                        \
    X(HAMI_CU(GraphLaunch_ptsz))                                                                                   \
    X(HAMI_CU(CtxCreate_v2))                                                                                       \
    X(HAMI_CU(CtxCreate_v3))                                                                                       \
    X(HAMI_CU(CtxCreate_v4))                                                                                       \
    X(HAMI_CU(CtxDestroy_v2))                                                                                      \
    X(HAMI_CU(CtxSetCurrent))                                                                                      \
    X(HAMI_CU(CtxPushCurrent_v2))                                                                                  \
    X(HAMI_CU(CtxPopCurrent_v2))                                                                                   \
    X(HAMI_CU(DevicePrimaryCtxRetain))                                                                             \
    X(HAMI_CU(DevicePrimaryCtxReset_v2))

/* Driver functions the layer calls without intercepting them. */
#define HAMI_CUDA_CALLS(X)                                                                                         \
    X(HAMI_CU(DeviceGetCount))                                                                                     \
    X(HAMI_CU(CtxGetCurrent))                                                                                      \
    X(HAMI_CU(CtxGetDevice))                                                                                       \
    X(HAMI_CU(EventCreate))                                                                                        \
    X(HAMI_CU(EventRecord))                                                                                        \
    X(HAMI_CU(EventQuery))                                                                                         \
    X(HAMI_CU(EventElapsedTime))                                                                                   \
    X(HAMI_CU(EventSynchronize))                                                                                   \
    X(HAMI_CU(EventDestroy_v2))                                                                                    \
    X(HAMI_CU(StreamIsCapturing))

#ifdef HAMI_CUDA_NVML_LIBRARIES
#define HAMI_NVML_HOOKS(X)                                                                                         \
    X(nvmlDeviceGetMemoryInfo)                                                                                     \
    X(nvmlDeviceGetMemoryInfo_v2)

#define HAMI_NVML_CALLS(X)                                                                                         \
    X(nvmlDeviceGetIndex)                                                                                          \
    X(nvmlInit_v2)                                                                                                 \
    X(nvmlDeviceGetHandleByIndex_v2)                                                                               \
    X(nvmlDeviceGetProcessUtilization)                                                                             \
    X(nvmlDeviceGetComputeRunningProcesses)
#else
#define HAMI_NVML_HOOKS(X)
#define HAMI_NVML_CALLS(X)
#endif

struct hami_cu_real {
#define HAMI_FIELD(name) __typeof__(&name) name;
    HAMI_CUDA_HOOKS(HAMI_FIELD)
    HAMI_CUDA_CALLS(HAMI_FIELD)
    HAMI_NVML_HOOKS(HAMI_FIELD)
    HAMI_NVML_CALLS(HAMI_FIELD)
#undef HAMI_FIELD
};

/* The driver's own functions (NULL when the driver, or that function, is missing). */
extern struct hami_cu_real hami_real;

/* The real dlsym's answer (never a hook): what a vendor's own hooks use to find the real functions they wrap. */
void *hami_cu_real_symbol(void *handle, const char *name);

/* driver.c: loading the real libraries on first use; 1 when loaded, 0 when missing. */
int hami_cu_load_cuda(void);
int hami_cu_load_nvml(void);
extern _Atomic int hami_cu_cuda_state; /* 0 not tried, 1 loaded, -1 missing */
extern _Atomic int hami_cu_nvml_state;

static inline int hami_cu_cuda(void) {
    int state = atomic_load_explicit(&hami_cu_cuda_state, memory_order_acquire);
    return HAMI_LIKELY(state) ? state > 0 : hami_cu_load_cuda();
}

static inline int hami_cu_nvml(void) {
    int state = atomic_load_explicit(&hami_cu_nvml_state, memory_order_acquire);
    return HAMI_LIKELY(state) ? state > 0 : hami_cu_load_nvml();
}

/* Every CUDA hook starts with this: a clean error when the driver or the function is missing. */
#define HAMI_CUDA_ENTER(name)                                                                                  \
    do {                                                                                                       \
        if (HAMI_UNLIKELY(!hami_cu_cuda())) return CUDA_ERROR_NOT_INITIALIZED;                                 \
        if (HAMI_UNLIKELY(!hami_real.name)) return CUDA_ERROR_NOT_FOUND;                                       \
        if (HAMI_UNLIKELY(hami_log_level >= HAMI_LOG_TRACE)) hami_log(HAMI_LOG_TRACE, "%s", HAMI_STR(name));   \
    } while (0)

#define HAMI_NVML_ENTER(name)                                                                                  \
    do {                                                                                                       \
        if (HAMI_UNLIKELY(!hami_cu_nvml())) return NVML_ERROR_LIBRARY_NOT_FOUND;                               \
        if (HAMI_UNLIKELY(!hami_real.name)) return NVML_ERROR_FUNCTION_NOT_FOUND;                              \
        if (HAMI_UNLIKELY(hami_log_level >= HAMI_LOG_TRACE)) hami_log(HAMI_LOG_TRACE, "%s", HAMI_STR(name));   \
    } while (0)

/* The calling thread's current context and its device, cached; the context hooks invalidate it. */
struct hami_cu_thread {
    CUcontext context;
    int device;
    int valid;
};

extern _Thread_local struct hami_cu_thread hami_cu_tls __attribute__((tls_model("initial-exec")));

int hami_cu_refresh_device(void);

static inline int hami_cu_device(void) {
    if (HAMI_LIKELY(hami_cu_tls.valid)) return hami_cu_tls.device;
    return hami_cu_refresh_device();
}

static inline uint64_t hami_cu_owner(void) {
    (void)hami_cu_device();
    return (uint64_t)(uintptr_t)hami_cu_tls.context;
}

static inline void hami_cu_context_changed(void) { hami_cu_tls.valid = 0; }

/* launch.c */
int hami_cu_stream_capturing(void *stream);
int hami_cu_device_busy(int device, uint64_t *busy_ns);
int hami_cu_process_memory(int device, const unsigned *host_pids, size_t count, uint64_t *bytes);

#endif /* HAMI_CUDA_H */
