/*
 * vnpu.h: what the sources of libvnpu.so share: the lists of hooked and called functions of the runtime
 * (libruntime.so) and of AscendCL (libascendcl.so) (one place: the real-function table and the export list are
 * checked against them), the per-thread state (current device, the "count once" nesting state, launch timing),
 * and the entry checks every hook starts with.
 */
#ifndef HAMI_ASCEND_VNPU_H
#define HAMI_ASCEND_VNPU_H

#include <stdatomic.h>
#include <stdint.h>

#include "ascend_api.h"
#include "hami_isolation.h"

#define HAMI_EXPORT __attribute__((visibility("default")))
#define HAMI_LIKELY(x) __builtin_expect(!!(x), 1)
#define HAMI_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Runtime functions libvnpu.so exports and intercepts. Keep libvnpu.map and the tests' list in step. */
#define HAMI_RT_HOOKS(X)                                                                                       \
    X(rtMalloc)                                                                                                \
    X(rtFree)                                                                                                  \
    X(rtMallocPhysical)                                                                                        \
    X(rtFreePhysical)                                                                                          \
    X(rtMemGetInfoEx)                                                                                          \
    X(rtMemGetInfo)                                                                                            \
    X(rtSetDevice)                                                                                             \
    X(rtCtxSetCurrent)                                                                                         \
    X(rtKernelLaunch)                                                                                          \
    X(rtKernelLaunchWithFlagV2)                                                                                \
    X(rtKernelLaunchWithHandleV2)                                                                              \
    X(rtAicpuKernelLaunchExWithArgs)                                                                           \
    X(rtAicpuKernelLaunchWithFlag)                                                                             \
    X(rtModelExecute)

/* Runtime functions libvnpu.so calls without intercepting them. */
#define HAMI_RT_CALLS(X)                                                                                       \
    X(rtGetDevice)                                                                                             \
    X(rtGetDeviceCount)                                                                                        \
    X(rtEventCreate)                                                                                           \
    X(rtEventRecord)                                                                                           \
    X(rtEventQuery)                                                                                            \
    X(rtEventSynchronize)                                                                                      \
    X(rtEventElapsedTime)                                                                                      \
    X(rtEventDestroy)

/* AscendCL functions libvnpu.so exports and intercepts: those an application may reach without passing a hooked
 * runtime function on some CANN versions. Where they do reach one, the work is counted once (see memory.c). */
#define HAMI_ACL_HOOKS(X)                                                                                      \
    X(aclrtMalloc)                                                                                             \
    X(aclrtMallocAlign32)                                                                                      \
    X(aclrtMallocCached)                                                                                       \
    X(aclrtFree)                                                                                               \
    X(aclrtMallocPhysical)                                                                                     \
    X(aclrtFreePhysical)                                                                                       \
    X(aclrtGetMemInfo)                                                                                         \
    X(aclrtSetDevice)                                                                                          \
    X(aclrtSetCurrentContext)                                                                                  \
    X(aclrtLaunchKernel)                                                                                       \
    X(aclrtLaunchKernelWithConfig)                                                                             \
    X(aclopExecuteV2)                                                                                          \
    X(aclmdlExecute)                                                                                           \
    X(aclmdlExecuteAsync)

struct hami_vnpu_real {
#define HAMI_FIELD(name) __typeof__(&name) name;
    HAMI_RT_HOOKS(HAMI_FIELD)
    HAMI_RT_CALLS(HAMI_FIELD)
    HAMI_ACL_HOOKS(HAMI_FIELD)
#undef HAMI_FIELD
};

/* The real functions (NULL when their library, or that function, is missing). */
extern struct hami_vnpu_real hami_real;

/* runtime.c: finding the real libraries on first use; 1 when found, 0 when missing. */
int hami_vnpu_load_runtime(void);
int hami_vnpu_load_acl(void);
extern _Atomic int hami_vnpu_runtime_state; /* 0 not tried, 1 loaded, -1 missing */
extern _Atomic int hami_vnpu_acl_state;

static inline int hami_vnpu_runtime(void) {
    int state = atomic_load_explicit(&hami_vnpu_runtime_state, memory_order_acquire);
    return HAMI_LIKELY(state) ? state > 0 : hami_vnpu_load_runtime();
}

static inline int hami_vnpu_acl(void) {
    int state = atomic_load_explicit(&hami_vnpu_acl_state, memory_order_acquire);
    return HAMI_LIKELY(state) ? state > 0 : hami_vnpu_load_acl();
}

/* Every runtime hook starts with this: a clean error when the runtime or the function is missing. */
#define HAMI_RT_ENTER(name)                                                                                    \
    do {                                                                                                       \
        if (HAMI_UNLIKELY(!hami_vnpu_runtime())) return ACL_ERROR_RT_INTERNAL_ERROR;                           \
        if (HAMI_UNLIKELY(!hami_real.name)) return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;                           \
        if (HAMI_UNLIKELY(hami_log_level >= HAMI_LOG_TRACE)) hami_log(HAMI_LOG_TRACE, "%s", #name);             \
    } while (0)

/* Every AscendCL hook starts with this: the same for libascendcl.so. */
#define HAMI_ACL_ENTER(name)                                                                                   \
    do {                                                                                                       \
        if (HAMI_UNLIKELY(!hami_vnpu_acl())) return ACL_ERROR_RT_INTERNAL_ERROR;                               \
        if (HAMI_UNLIKELY(!hami_real.name)) return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;                           \
        if (HAMI_UNLIKELY(hami_log_level >= HAMI_LOG_TRACE)) hami_log(HAMI_LOG_TRACE, "%s", #name);             \
    } while (0)

/* The calling thread's state. */
struct hami_vnpu_thread {
    int device; /* current device, cached; the device-changing hooks invalidate it */
    int valid;
    /* "Count once": while an AscendCL hook is inside its real call (depth > 0), the runtime hooks underneath
     * neither admit launches again nor reserve memory the AscendCL hook already reserved (`pending`). */
    int depth;
    int pending;        /* an AscendCL allocation hook reserved `pending_bytes` on `pending_device` */
    int pending_taken;  /* a runtime allocation hook underneath took that reservation over */
    int pending_device;
    uint64_t pending_bytes;
};

extern _Thread_local struct hami_vnpu_thread hami_vnpu_tls __attribute__((tls_model("initial-exec")));

int hami_vnpu_refresh_device(void);

/* The visible device the calling thread works on (0 when none is set: the runtime refuses the call anyway). */
static inline int hami_vnpu_device(void) {
    if (HAMI_LIKELY(hami_vnpu_tls.valid)) return hami_vnpu_tls.device;
    return hami_vnpu_refresh_device();
}

static inline void hami_vnpu_device_changed(void) { hami_vnpu_tls.valid = 0; }

#endif /* HAMI_ASCEND_VNPU_H */
