/*
 * vmusa.h: what libvmusa.so's own sources share (the driver hooks are the core layer's, hami_cuda.h; the lists of
 * Moore Threads' own hooks are in hami_cuda_vendor.h): the MUSA runtime functions called without being intercepted,
 * the table of the real runtime's functions, and the entry check of every runtime hook.
 */
#ifndef HAMI_MTHREADS_VMUSA_H
#define HAMI_MTHREADS_VMUSA_H

#include "hami_cuda.h"
#include "musa_runtime_api.h"

/* MUSA runtime functions libvmusa.so calls without intercepting them. */
#define HAMI_MUSA_CALLS(X)                                                                                     \
    X(musaGetDevice)                                                                                           \
    X(musaGetDeviceCount)                                                                                      \
    X(musaEventCreate)                                                                                         \
    X(musaEventRecord)                                                                                         \
    X(musaEventQuery)                                                                                          \
    X(musaEventSynchronize)                                                                                    \
    X(musaEventElapsedTime)                                                                                    \
    X(musaEventDestroy)                                                                                        \
    X(musaStreamIsCapturing)

struct hami_musa_real {
#define HAMI_FIELD(name) __typeof__(&name) name;
    HAMI_MUSA_HOOKS(HAMI_FIELD)
    HAMI_MUSA_CALLS(HAMI_FIELD)
#undef HAMI_FIELD
};

/* The runtime's own functions (NULL when the runtime, or that function, is missing). */
extern struct hami_musa_real hami_musa;

int hami_musa_load(void);                     /* 1 once the real runtime is found, 0 when it is missing */
int hami_musa_from_runtime(const void *caller); /* a return address inside the real runtime */
int hami_musa_device(void);                   /* the calling thread's current device, cached */

/* Every runtime hook starts with this: a clean error when the runtime or the function is missing. */
#define HAMI_MUSA_ENTER(name)                                                                                  \
    do {                                                                                                       \
        if (__builtin_expect(!hami_musa_load(), 0)) return musaErrorInitializationError;                       \
        if (__builtin_expect(!hami_musa.name, 0)) return musaErrorNotSupported;                                \
        if (__builtin_expect(hami_log_level >= HAMI_LOG_TRACE, 0)) hami_log(HAMI_LOG_TRACE, "%s", #name);       \
    } while (0)

#endif /* HAMI_MTHREADS_VMUSA_H */
