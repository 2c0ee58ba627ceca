/*
 * vmlu.h: what the sources of libvmlu.so share: the lists of hooked and called CNDrv/CNRT functions (one place:
 * the real-function table, the export list and cnGetExportFunction's answers are checked against them), the
 * per-thread device cache, the caller check, and the entry checks every hook starts with.
 */
#ifndef HAMI_CAMBRICON_VMLU_H
#define HAMI_CAMBRICON_VMLU_H

#include <stdatomic.h>
#include <stdint.h>

#include "cn_api.h"
#include "hami_isolation.h"

#define HAMI_EXPORT __attribute__((visibility("default")))
#define HAMI_LIKELY(x) __builtin_expect(!!(x), 1)
#define HAMI_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* CNDrv functions libvmlu.so exports and intercepts. Keep libvmlu.map and the tests' list in step. */
#define HAMI_CN_HOOKS(X)                                                                                       \
    X(cnMalloc)                                                                                                \
    X(cnMallocSecurity)                                                                                        \
    X(cnMallocNode)                                                                                            \
    X(cnZmalloc)                                                                                               \
    X(cnZmallocNode)                                                                                           \
    X(cnMallocConstant)                                                                                        \
    X(cnMallocNodeConstant)                                                                                    \
    X(cnMallocFrameBuffer)                                                                                     \
    X(cnMallocPeerAble)                                                                                        \
    X(cnFree)                                                                                                  \
    X(cnMemAllocAsync)                                                                                         \
    X(cnMemAllocFromPoolAsync)                                                                                 \
    X(cnMemFreeAsync)                                                                                          \
    X(cnMemCreate)                                                                                             \
    X(cnMemRelease)                                                                                            \
    X(cnMemGetInfo)                                                                                            \
    X(cnMemGetNodeInfo)                                                                                        \
    X(cnDeviceTotalMem)                                                                                        \
    X(cnInvokeKernel)                                                                                          \
    X(cnInvokeKernelEx)                                                                                        \
    X(cnGetExportFunction)

/* CNRT functions libvmlu.so exports and intercepts. */
#define HAMI_CNRT_HOOKS(X)                                                                                     \
    X(cnrtMalloc)                                                                                              \
    X(cnrtFree)                                                                                                \
    X(cnrtMemGetInfo)                                                                                          \
    X(cnrtDeviceGetAttribute)                                                                                  \
    X(cnrtInvokeKernel)                                                                                        \
    X(cnrtSetDevice)

/* Functions libvmlu.so calls without intercepting them. */
#define HAMI_CN_CALLS(X) X(cnCtxGetDevice) X(cnDeviceGetCount)
#define HAMI_CNRT_CALLS(X)                                                                                     \
    X(cnrtGetDevice)                                                                                           \
    X(cnrtGetDeviceCount)                                                                                      \
    X(cnrtNotifierCreate)                                                                                      \
    X(cnrtNotifierDestroy)                                                                                     \
    X(cnrtPlaceNotifier)                                                                                       \
    X(cnrtQueryNotifier)                                                                                       \
    X(cnrtWaitNotifier)                                                                                        \
    X(cnrtNotifierElapsedTime)

struct hami_vmlu_real {
#define HAMI_FIELD(name) __typeof__(&name) name;
    HAMI_CN_HOOKS(HAMI_FIELD)
    HAMI_CNRT_HOOKS(HAMI_FIELD)
    HAMI_CN_CALLS(HAMI_FIELD)
    HAMI_CNRT_CALLS(HAMI_FIELD)
#undef HAMI_FIELD
};

extern struct hami_vmlu_real hami_real;

/* runtime.c: finding the real CNDrv and CNRT on first use; 1 when CNDrv or CNRT was found, 0 when neither. */
int hami_vmlu_load(void);
extern _Atomic int hami_vmlu_state; /* 0 not tried, 1 loaded, -1 missing */

static inline int hami_vmlu_runtime(void) {
    int state = atomic_load_explicit(&hami_vmlu_state, memory_order_acquire);
    return HAMI_LIKELY(state) ? state > 0 : hami_vmlu_load();
}

/* The address ranges of the real libcndrv.so and libcnrt.so, and of libvmlu.so itself: a hook called from inside
 * them (CNRT calling CNDrv, either calling its own exported functions) passes the call straight through, so an
 * allocation is counted once, at the outermost API the application called (see runtime.c). */
#define HAMI_VMLU_RANGES 3
extern uintptr_t hami_vmlu_lo[HAMI_VMLU_RANGES], hami_vmlu_hi[HAMI_VMLU_RANGES];

static inline int hami_vmlu_from_inside(const void *caller) {
    uintptr_t a = (uintptr_t)caller;
    for (int i = 0; i < HAMI_VMLU_RANGES; i++)
        if (a >= hami_vmlu_lo[i] && a < hami_vmlu_hi[i]) return 1;
    return 0;
}

/* Every hook starts with one of these: a clean error when the library or the function is missing. */
#define HAMI_VMLU_ENTER(name, not_initialized, not_supported)                                                  \
    do {                                                                                                       \
        if (HAMI_UNLIKELY(!hami_vmlu_runtime())) return (not_initialized);                                     \
        if (HAMI_UNLIKELY(!hami_real.name)) return (not_supported);                                            \
        if (HAMI_UNLIKELY(hami_log_level >= HAMI_LOG_TRACE)) hami_log(HAMI_LOG_TRACE, "%s", #name);             \
    } while (0)
#define HAMI_CN_ENTER(name) HAMI_VMLU_ENTER(name, CN_ERROR_NOT_INITIALIZED, CN_OPS_ERROR_NOT_SUPPORTED)
#define HAMI_CNRT_ENTER(name) HAMI_VMLU_ENTER(name, cnrtErrorInit, cnrtErrorNotSupport)
#define FROM_INSIDE() hami_vmlu_from_inside(__builtin_return_address(0))

/* The current device: CNRT's (cached per thread; cnrtSetDevice invalidates it), else the current CNDrv
 * context's. */
struct hami_vmlu_thread {
    int device;
    int valid;
};

extern _Thread_local struct hami_vmlu_thread hami_vmlu_tls __attribute__((tls_model("initial-exec")));

int hami_vmlu_refresh_device(void);

static inline int hami_vmlu_device(void) {
    if (HAMI_LIKELY(hami_vmlu_tls.valid)) return hami_vmlu_tls.device;
    return hami_vmlu_refresh_device();
}

#endif /* HAMI_CAMBRICON_VMLU_H */
