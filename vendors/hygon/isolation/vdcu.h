/*
 * vdcu.h: what the sources of libvdcu.so share: the lists of hooked and called HIP functions (one place: the
 * real-function table, the export list and hipGetProcAddress's answers are checked against them), the per-thread
 * state (current device, launch timing), the caller check, and the entry check every hook starts with.
 */
#ifndef HAMI_HYGON_VDCU_H
#define HAMI_HYGON_VDCU_H

#include <stdatomic.h>
#include <stdint.h>

#include "hami_isolation.h"
#include "hip_api.h"

#define HAMI_EXPORT __attribute__((visibility("default")))
#define HAMI_LIKELY(x) __builtin_expect(!!(x), 1)
#define HAMI_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* HIP functions libvdcu.so exports and intercepts. Keep libvdcu.map and the tests' list in step. */
#define HAMI_HIP_HOOKS(X)                                                                                      \
    X(hipMalloc)                                                                                               \
    X(hipFree)                                                                                                 \
    X(hipMallocManaged)                                                                                        \
    X(hipMallocAsync)                                                                                          \
    X(hipMallocFromPoolAsync)                                                                                  \
    X(hipFreeAsync)                                                                                            \
    X(hipMallocPitch)                                                                                          \
    X(hipExtMallocWithFlags)                                                                                   \
    X(hipMemCreate)                                                                                            \
    X(hipMemRelease)                                                                                           \
    X(hipMemGetInfo)                                                                                           \
    X(hipDeviceTotalMem)                                                                                       \
    X(hipSetDevice)                                                                                            \
    X(hipLaunchKernel)                                                                                         \
    X(hipExtLaunchKernel)                                                                                      \
    X(hipLaunchCooperativeKernel)                                                                              \
    X(hipModuleLaunchKernel)                                                                                   \
    X(hipModuleLaunchCooperativeKernel)                                                                        \
    X(hipExtModuleLaunchKernel)                                                                                \
    X(hipHccModuleLaunchKernel)                                                                                \
    X(hipGraphLaunch)                                                                                          \
    X(hipGetProcAddress)

/* HIP functions libvdcu.so calls without intercepting them. */
#define HAMI_HIP_CALLS(X)                                                                                      \
    X(hipGetDevice)                                                                                            \
    X(hipGetDeviceCount)                                                                                       \
    X(hipEventCreate)                                                                                          \
    X(hipEventRecord)                                                                                          \
    X(hipEventQuery)                                                                                           \
    X(hipEventSynchronize)                                                                                     \
    X(hipEventElapsedTime)                                                                                     \
    X(hipEventDestroy)                                                                                         \
    X(hipStreamIsCapturing)

struct hami_vdcu_real {
#define HAMI_FIELD(name) __typeof__(&name) name;
    HAMI_HIP_HOOKS(HAMI_FIELD)
    HAMI_HIP_CALLS(HAMI_FIELD)
#undef HAMI_FIELD
};

extern struct hami_vdcu_real hami_real;

/* runtime.c: finding the real HIP runtime on first use; 1 when found, 0 when missing. */
int hami_vdcu_load(void);
extern _Atomic int hami_vdcu_state; /* 0 not tried, 1 loaded, -1 missing */

static inline int hami_vdcu_runtime(void) {
    int state = atomic_load_explicit(&hami_vdcu_state, memory_order_acquire);
    return HAMI_LIKELY(state) ? state > 0 : hami_vdcu_load();
}

/* The address range of the real HIP runtime: a hook called from inside it (HIP calling its own exported
 * functions) passes the call straight through, so nothing is counted twice and HIP's initialisation never meets
 * the isolation layer (see runtime.c). */
extern uintptr_t hami_vdcu_hip_lo, hami_vdcu_hip_hi, hami_vdcu_self_lo, hami_vdcu_self_hi;

static inline int hami_vdcu_from_hip(const void *caller) {
    uintptr_t a = (uintptr_t)caller;
    return (a >= hami_vdcu_hip_lo && a < hami_vdcu_hip_hi) || (a >= hami_vdcu_self_lo && a < hami_vdcu_self_hi);
}

/* Every hook starts with this: a clean error when the runtime or the function is missing. */
#define HAMI_HIP_ENTER(name)                                                                                   \
    do {                                                                                                       \
        if (HAMI_UNLIKELY(!hami_vdcu_runtime())) return hipErrorNotInitialized;                                \
        if (HAMI_UNLIKELY(!hami_real.name)) return hipErrorNotSupported;                                       \
        if (HAMI_UNLIKELY(hami_log_level >= HAMI_LOG_TRACE)) hami_log(HAMI_LOG_TRACE, "%s", #name);             \
    } while (0)

struct hami_vdcu_thread {
    int device; /* current device, cached; hipSetDevice invalidates it */
    int valid;
};

extern _Thread_local struct hami_vdcu_thread hami_vdcu_tls __attribute__((tls_model("initial-exec")));

int hami_vdcu_refresh_device(void);

static inline int hami_vdcu_device(void) {
    if (HAMI_LIKELY(hami_vdcu_tls.valid)) return hami_vdcu_tls.device;
    return hami_vdcu_refresh_device();
}

/* memory.c / launch.c / runtime.c: the hook of a name, for hipGetProcAddress (NULL when not hooked). */
void *hami_vdcu_hook_of(const char *name);

#endif /* HAMI_HYGON_VDCU_H */
