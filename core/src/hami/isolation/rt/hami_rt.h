/*
 * hami_rt.h: the CUDA-runtime-shaped hook layer, one building block for every vendor whose runtime API is CUDA's
 * runtime under another prefix (HIP's hip*, MACA's mc*): device memory of every allocating and freeing call, the
 * memory queries, every launch through the core's compute limiter timed with the runtime's own events, the current
 * device, and the "called from inside the runtime" rule (a hook whose return address lies in the real runtime, or
 * in the library itself, passes the call straight through: see runtime.c).
 *
 * The layer's sources (runtime.c, memory.c, launch.c) are compiled into the vendor's library together with the C
 * core when the vendor's LibrarySpec names the layer (layers=("rt",)). They include the vendor's own
 * `hami_rt_vendor.h` (in its hooks directory), which says only:
 *
 *   HAMI_RT(suffix)            the vendor's symbol for a runtime function: `hip##suffix`, `mc##suffix`
 *   HAMI_RT_PREFIX             the same prefix as a string ("hip"), for lookups and log lines
 *   HAMI_RT_VENDOR_NAME        "metax": written into the accounting file and log lines
 *   HAMI_RT_LIBRARIES          the runtime, a list of string literals tried in order after dlsym(RTLD_NEXT)
 *   HAMI_RT_ENV_MEMORY_LIMIT, _CORE_LIMIT, _SHARED_CACHE, _OVERSUBSCRIBE, _PRIORITY, _POLICY, _LOG_LEVEL,
 *   _UUIDS                     the environment variables' names; HAMI_RT_DEFAULT_CACHE the accounting file when
 *                              the variable is unset
 *   HAMI_RT_ERROR_NOT_SUPPORTED the runtime's "not supported" code (HIP 801); success 0, invalid value 1, out of
 *                              memory 2 and not initialized 3 are the same in every CUDA-shaped runtime
 *   HAMI_RT_HAS_HIP_EXTRAS      0 when the runtime lacks ExtMallocWithFlags and ModuleLaunchKernel (HIP and MACA
 *                              have them: the default 1; the CUDA runtime's shape, MUSA's, has neither)
 *   HAMI_RT_HAS_POOL, _VMM, _DEVICE_TOTAL_MEM, _EXT_LAUNCH, _HCC, _MODULE_COOPERATIVE, _LAUNCH_EXC, _PROC_ADDRESS
 *                              optional (1): the runtime has MallocFromPoolAsync; MemCreate/MemRelease;
 *                              DeviceTotalMem; ExtLaunchKernel/ExtModuleLaunchKernel; HccModuleLaunchKernel;
 *                              ModuleLaunchCooperativeKernel; LaunchKernelExC (CUDA's cudaLaunchKernelExC: the
 *                              grid in a launch-config struct); GetProcAddress (HIP's signature), whose answers
 *                              are swapped for the hooks
 *
 * and its version script, which exports exactly the hooks (HAMI_RT_HOOKS below) and the core's lookup doors
 * (`dlsym; dlvsym; dlopen; dlmopen;`: lookup.c answers them from hami_rt_hook_of). The declarations here are the
 * CUDA runtime's shapes with opaque handles as pointers; a runtime must have the same signatures and error values
 * (stated by each vendor's README).
 */
#ifndef HAMI_RT_H
#define HAMI_RT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "hami_isolation.h"
#include "hami_rt_vendor.h"

#if !defined(HAMI_RT) || !defined(HAMI_RT_PREFIX) || !defined(HAMI_RT_VENDOR_NAME) || !defined(HAMI_RT_LIBRARIES)
#error "hami_rt_vendor.h must define HAMI_RT(suffix), HAMI_RT_PREFIX, HAMI_RT_VENDOR_NAME and HAMI_RT_LIBRARIES"
#endif
#ifndef HAMI_RT_ERROR_NOT_SUPPORTED
#error "hami_rt_vendor.h must define HAMI_RT_ERROR_NOT_SUPPORTED"
#endif

#define HAMI_EXPORT __attribute__((visibility("default")))
#define HAMI_LIKELY(x) __builtin_expect(!!(x), 1)
#define HAMI_UNLIKELY(x) __builtin_expect(!!(x), 0)

typedef int hami_rt_error;
enum {
    HAMI_RT_SUCCESS = 0,
    HAMI_RT_ERROR_INVALID_VALUE = 1,
    HAMI_RT_ERROR_OUT_OF_MEMORY = 2,
    HAMI_RT_ERROR_NOT_INITIALIZED = 3,
};

typedef void *hami_rt_stream;
typedef void *hami_rt_event;
typedef void *hami_rt_function;
typedef unsigned long long hami_rt_mem_handle;

typedef struct hami_rt_dim3 {
    uint32_t x, y, z;
} hami_rt_dim3;

/* hipMemAllocationProp's layout (the location is what the layer reads). */
typedef struct hami_rt_mem_prop {
    int type;
    int requestedHandleType;
    struct {
        int type; /* 1: a device */
        int id;
    } location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
    } allocFlags;
} hami_rt_mem_prop;

#define HAMI_RT_LOCATION_DEVICE 1

/* The launch configuration LaunchKernelExC takes: CUDA's cudaLaunchConfig_t (gridDim, blockDim, dynamicSmemBytes,
 * stream, attrs, numAttrs), taken by parity for every runtime that opts in (HAMI_RT_HAS_LAUNCH_EXC); HIP's
 * hipLaunchConfig_t has the same fields in the same order. The attributes are passed on, never read. */
typedef struct hami_rt_launch_config {
    hami_rt_dim3 gridDim;
    hami_rt_dim3 blockDim;
    size_t dynamicSmemBytes;
    hami_rt_stream stream;
    void *attrs;
    unsigned int numAttrs;
} hami_rt_launch_config;

/* ---- the hooks: the common set, then what a vendor's runtime has besides ------------------------------- */

#define HAMI_RT_COMMON_HOOKS(X)                                                                                \
    X(Malloc)                                                                                                  \
    X(Free)                                                                                                    \
    X(MallocManaged)                                                                                           \
    X(MallocAsync)                                                                                             \
    X(FreeAsync)                                                                                               \
    X(MallocPitch)                                                                                             \
    X(MemGetInfo)                                                                                              \
    X(SetDevice)                                                                                               \
    X(LaunchKernel)                                                                                            \
    X(LaunchCooperativeKernel)                                                                                 \
    X(GraphLaunch)

/* HIP's and MACA's own, in every runtime unless the vendor says otherwise (the CUDA runtime and MUSA's have
 * neither): ExtMallocWithFlags and the driver-style ModuleLaunchKernel. */
#ifndef HAMI_RT_HAS_HIP_EXTRAS
#define HAMI_RT_HAS_HIP_EXTRAS 1
#endif
#if HAMI_RT_HAS_HIP_EXTRAS
#define HAMI_RT_HIP_EXTRA_HOOKS(X) X(ExtMallocWithFlags) X(ModuleLaunchKernel)
#else
#define HAMI_RT_HIP_EXTRA_HOOKS(X)
#endif

#if defined(HAMI_RT_HAS_POOL) && HAMI_RT_HAS_POOL
#define HAMI_RT_POOL_HOOKS(X) X(MallocFromPoolAsync)
#else
#define HAMI_RT_POOL_HOOKS(X)
#endif
#if defined(HAMI_RT_HAS_VMM) && HAMI_RT_HAS_VMM
#define HAMI_RT_VMM_HOOKS(X) X(MemCreate) X(MemRelease)
#else
#define HAMI_RT_VMM_HOOKS(X)
#endif
#if defined(HAMI_RT_HAS_DEVICE_TOTAL_MEM) && HAMI_RT_HAS_DEVICE_TOTAL_MEM
#define HAMI_RT_TOTAL_HOOKS(X) X(DeviceTotalMem)
#else
#define HAMI_RT_TOTAL_HOOKS(X)
#endif
#if defined(HAMI_RT_HAS_EXT_LAUNCH) && HAMI_RT_HAS_EXT_LAUNCH
#define HAMI_RT_EXT_HOOKS(X) X(ExtLaunchKernel) X(ExtModuleLaunchKernel)
#else
#define HAMI_RT_EXT_HOOKS(X)
#endif
#if defined(HAMI_RT_HAS_HCC) && HAMI_RT_HAS_HCC
#define HAMI_RT_HCC_HOOKS(X) X(HccModuleLaunchKernel)
#else
#define HAMI_RT_HCC_HOOKS(X)
#endif
#if defined(HAMI_RT_HAS_MODULE_COOPERATIVE) && HAMI_RT_HAS_MODULE_COOPERATIVE
#define HAMI_RT_MODULE_COOPERATIVE_HOOKS(X) X(ModuleLaunchCooperativeKernel)
#else
#define HAMI_RT_MODULE_COOPERATIVE_HOOKS(X)
#endif
#if defined(HAMI_RT_HAS_LAUNCH_EXC) && HAMI_RT_HAS_LAUNCH_EXC
#define HAMI_RT_LAUNCH_EXC_HOOKS(X) X(LaunchKernelExC)
#else
#define HAMI_RT_LAUNCH_EXC_HOOKS(X)
#endif
#if defined(HAMI_RT_HAS_PROC_ADDRESS) && HAMI_RT_HAS_PROC_ADDRESS
#define HAMI_RT_PROC_HOOKS(X) X(GetProcAddress)
#else
#define HAMI_RT_PROC_HOOKS(X)
#endif

/* Every function the library exports and intercepts. Keep the vendor's version script and tests in step. */
#define HAMI_RT_HOOKS(X)                                                                                       \
    HAMI_RT_COMMON_HOOKS(X)                                                                                    \
    HAMI_RT_HIP_EXTRA_HOOKS(X)                                                                                 \
    HAMI_RT_POOL_HOOKS(X)                                                                                      \
    HAMI_RT_VMM_HOOKS(X)                                                                                       \
    HAMI_RT_TOTAL_HOOKS(X)                                                                                     \
    HAMI_RT_EXT_HOOKS(X)                                                                                       \
    HAMI_RT_HCC_HOOKS(X)                                                                                       \
    HAMI_RT_MODULE_COOPERATIVE_HOOKS(X)                                                                        \
    HAMI_RT_LAUNCH_EXC_HOOKS(X)                                                                                \
    HAMI_RT_PROC_HOOKS(X)

/* Runtime functions the library calls without intercepting them. */
#define HAMI_RT_CALLS(X)                                                                                       \
    X(GetDevice)                                                                                               \
    X(GetDeviceCount)                                                                                          \
    X(EventCreate)                                                                                             \
    X(EventRecord)                                                                                             \
    X(EventQuery)                                                                                              \
    X(EventSynchronize)                                                                                        \
    X(EventElapsedTime)                                                                                        \
    X(EventDestroy)                                                                                            \
    X(StreamIsCapturing)

/* ---- declarations (the CUDA runtime's shapes) ------------------------------------------------------------ */

hami_rt_error HAMI_RT(Malloc)(void **ptr, size_t size);
hami_rt_error HAMI_RT(Free)(void *ptr);
hami_rt_error HAMI_RT(MallocManaged)(void **dev_ptr, size_t size, unsigned int flags);
hami_rt_error HAMI_RT(MallocAsync)(void **dev_ptr, size_t size, hami_rt_stream stream);
hami_rt_error HAMI_RT(MallocFromPoolAsync)(void **dev_ptr, size_t size, void *mem_pool, hami_rt_stream stream);
hami_rt_error HAMI_RT(FreeAsync)(void *dev_ptr, hami_rt_stream stream);
hami_rt_error HAMI_RT(MallocPitch)(void **ptr, size_t *pitch, size_t width, size_t height);
hami_rt_error HAMI_RT(ExtMallocWithFlags)(void **ptr, size_t sizeBytes, unsigned int flags);
hami_rt_error HAMI_RT(MemCreate)(hami_rt_mem_handle *handle, size_t size, const hami_rt_mem_prop *prop,
                                 unsigned long long flags);
hami_rt_error HAMI_RT(MemRelease)(hami_rt_mem_handle handle);
hami_rt_error HAMI_RT(MemGetInfo)(size_t *free, size_t *total);
hami_rt_error HAMI_RT(DeviceTotalMem)(size_t *bytes, int device);
hami_rt_error HAMI_RT(SetDevice)(int deviceId);
hami_rt_error HAMI_RT(GetDevice)(int *deviceId);
hami_rt_error HAMI_RT(GetDeviceCount)(int *count);
hami_rt_error HAMI_RT(LaunchKernel)(const void *function_address, hami_rt_dim3 numBlocks, hami_rt_dim3 dimBlocks,
                                    void **args, size_t sharedMemBytes, hami_rt_stream stream);
hami_rt_error HAMI_RT(ExtLaunchKernel)(const void *function_address, hami_rt_dim3 numBlocks, hami_rt_dim3 dimBlocks,
                                       void **args, size_t sharedMemBytes, hami_rt_stream stream,
                                       hami_rt_event startEvent, hami_rt_event stopEvent, int flags);
hami_rt_error HAMI_RT(LaunchKernelExC)(const hami_rt_launch_config *config, const void *func, void **args);
hami_rt_error HAMI_RT(LaunchCooperativeKernel)(const void *f, hami_rt_dim3 gridDim, hami_rt_dim3 blockDimX,
                                               void **kernelParams, unsigned int sharedMemBytes,
                                               hami_rt_stream stream);
hami_rt_error HAMI_RT(ModuleLaunchKernel)(hami_rt_function f, unsigned int gridDimX, unsigned int gridDimY,
                                          unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                          unsigned int blockDimZ, unsigned int sharedMemBytes, hami_rt_stream stream,
                                          void **kernelParams, void **extra);
hami_rt_error HAMI_RT(ModuleLaunchCooperativeKernel)(hami_rt_function f, unsigned int gridDimX, unsigned int gridDimY,
                                                     unsigned int gridDimZ, unsigned int blockDimX,
                                                     unsigned int blockDimY, unsigned int blockDimZ,
                                                     unsigned int sharedMemBytes, hami_rt_stream stream,
                                                     void **kernelParams);
hami_rt_error HAMI_RT(ExtModuleLaunchKernel)(hami_rt_function f, uint32_t globalWorkSizeX, uint32_t globalWorkSizeY,
                                             uint32_t globalWorkSizeZ, uint32_t localWorkSizeX,
                                             uint32_t localWorkSizeY, uint32_t localWorkSizeZ, size_t sharedMemBytes,
                                             hami_rt_stream hStream, void **kernelParams, void **extra,
                                             hami_rt_event startEvent, hami_rt_event stopEvent, uint32_t flags);
hami_rt_error HAMI_RT(HccModuleLaunchKernel)(hami_rt_function f, uint32_t globalWorkSizeX, uint32_t globalWorkSizeY,
                                             uint32_t globalWorkSizeZ, uint32_t localWorkSizeX,
                                             uint32_t localWorkSizeY, uint32_t localWorkSizeZ, size_t sharedMemBytes,
                                             hami_rt_stream hStream, void **kernelParams, void **extra,
                                             hami_rt_event startEvent, hami_rt_event stopEvent);
hami_rt_error HAMI_RT(GraphLaunch)(void *graphExec, hami_rt_stream stream);
hami_rt_error HAMI_RT(GetProcAddress)(const char *symbol, void **pfn, int version, uint64_t flags, int *symbolStatus);
hami_rt_error HAMI_RT(EventCreate)(hami_rt_event *event);
hami_rt_error HAMI_RT(EventRecord)(hami_rt_event event, hami_rt_stream stream);
hami_rt_error HAMI_RT(EventQuery)(hami_rt_event event);
hami_rt_error HAMI_RT(EventSynchronize)(hami_rt_event event);
hami_rt_error HAMI_RT(EventElapsedTime)(float *ms, hami_rt_event start, hami_rt_event stop);
hami_rt_error HAMI_RT(EventDestroy)(hami_rt_event event);
hami_rt_error HAMI_RT(StreamIsCapturing)(hami_rt_stream stream, int *pCaptureStatus);

/* ---- the layer's state ------------------------------------------------------------------------------------ */

struct hami_rt_real {
#define HAMI_RT_FIELD(name) __typeof__(&HAMI_RT(name)) name;
    HAMI_RT_HOOKS(HAMI_RT_FIELD)
    HAMI_RT_CALLS(HAMI_RT_FIELD)
#undef HAMI_RT_FIELD
};

extern struct hami_rt_real hami_rt_fn;

/* runtime.c: finding the real runtime on first use; 1 when found, 0 when missing. */
int hami_rt_load(void);
extern _Atomic int hami_rt_state; /* 0 not tried, 1 loaded, -1 missing */

static inline int hami_rt_runtime(void) {
    int state = atomic_load_explicit(&hami_rt_state, memory_order_acquire);
    return HAMI_LIKELY(state) ? state > 0 : hami_rt_load();
}

/* The address ranges of the real runtime and of this library (see runtime.c). */
extern uintptr_t hami_rt_lo, hami_rt_hi, hami_rt_self_lo, hami_rt_self_hi;

static inline int hami_rt_from_runtime(const void *caller) {
    uintptr_t a = (uintptr_t)caller;
    return (a >= hami_rt_lo && a < hami_rt_hi) || (a >= hami_rt_self_lo && a < hami_rt_self_hi);
}

/* Every hook starts with this: a clean error when the runtime or the function is missing. */
#define HAMI_RT_ENTER(name)                                                                                    \
    do {                                                                                                       \
        if (HAMI_UNLIKELY(!hami_rt_runtime())) return HAMI_RT_ERROR_NOT_INITIALIZED;                           \
        if (HAMI_UNLIKELY(!hami_rt_fn.name)) return HAMI_RT_ERROR_NOT_SUPPORTED;                                \
        if (HAMI_UNLIKELY(hami_log_level >= HAMI_LOG_TRACE)) hami_log(HAMI_LOG_TRACE, "%s%s", HAMI_RT_PREFIX, #name); \
    } while (0)

struct hami_rt_thread {
    int device; /* current device, cached; SetDevice invalidates it */
    int valid;
};

extern _Thread_local struct hami_rt_thread hami_rt_tls __attribute__((tls_model("initial-exec")));

int hami_rt_refresh_device(void);

static inline int hami_rt_device(void) {
    if (HAMI_LIKELY(hami_rt_tls.valid)) return hami_rt_tls.device;
    return hami_rt_refresh_device();
}

/* runtime.c: the hook of a runtime function name (NULL when not hooked), for GetProcAddress and dlvsym. */
void *hami_rt_hook_of(const char *name);

#endif /* HAMI_RT_H */
