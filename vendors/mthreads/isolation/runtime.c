/*
 * runtime.c: the MUSA runtime's hooks (musa*), beside the core's CUDA-compatible hook layer, which hooks the driver
 * API (mu*) with MUSA's names (hami_cuda_vendor.h).
 *
 * Why the runtime too: the MUSA runtime reaches the driver through the private table muGetExportTable hands it, not
 * through the driver's exported mu* functions, so a program using musaMalloc or musaLaunchKernel (torch_musa does)
 * would never meet the driver hooks. These hooks count and limit that traffic with the core's building blocks, the
 * same accounting file and limits as the driver hooks: every allocating call (musaMalloc, musaMallocManaged,
 * musaMallocAsync, musaMallocFromPoolAsync, musaMallocPitch) is reserved before the runtime is asked (over the
 * limit: musaErrorMemoryAllocation, 2), every free (musaFree, musaFreeAsync) gives back exactly what was counted,
 * musaMemGetInfo answers the container's view, and every launch (musaLaunchKernel, musaLaunchCooperativeKernel,
 * musaGraphLaunch) passes the core's compute limiter, timed with the runtime's events.
 *
 * Calls whose return address is inside the real runtime (the runtime calling its own exported functions) pass
 * straight through, so nothing is counted twice. The real runtime (libmusart.so, its SDK 4 and 5 sonames, MUSA's
 * directory) is resolved on the first hooked call, through the real dlsym (hami_cu_real_symbol: ours answers hooks). Without it every
 * hook answers musaErrorInitializationError; a function it lacks, musaErrorNotSupported. The driver hooks are
 * loaded first (hami_cu_cuda), so the core is configured once, from the layer's variables.
 *
 * The layer's dlsym and dlvsym answer these hooks and the driver's unversioned names (aliases.c): both are listed
 * in HAMI_CUDA_VENDOR_HOOKS (hami_cuda_vendor.h).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>

#include "hami_cuda.h"
#include "vmusa.h"

struct hami_musa_real hami_musa;
static _Atomic int g_state; /* 0 not tried, 1 loaded, -1 missing */
static uintptr_t g_lo, g_hi, g_self_lo, g_self_hi;
static _Thread_local struct {
    int device, valid;
} t_device __attribute__((tls_model("initial-exec")));

static const char *const RUNTIMES[] = {"libmusart.so", "libmusart.so.5", "libmusart.so.4", "libmusart.so.1.5",
                                       "/usr/local/musa/lib/libmusart.so"};

static void *resolve(void **library, const char *name) {
    void *found = hami_cu_real_symbol(RTLD_NEXT, name);
    if (found) return found;
    for (size_t i = 0; !*library && i < sizeof RUNTIMES / sizeof *RUNTIMES; i++) {
        *library = dlopen(RUNTIMES[i], RTLD_NOW | RTLD_NOLOAD);
        if (!*library) *library = dlopen(RUNTIMES[i], RTLD_NOW | RTLD_LOCAL);
    }
    return *library ? hami_cu_real_symbol(*library, name) : NULL;
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void load_once(void) {
    (void)hami_cu_cuda(); /* configures the core from the layer's variables (and loads the driver) */
    void *library = NULL;
#define HAMI_RESOLVE(name) hami_musa.name = (__typeof__(hami_musa.name))resolve(&library, #name);
    HAMI_MUSA_HOOKS(HAMI_RESOLVE)
    HAMI_MUSA_CALLS(HAMI_RESOLVE)
#undef HAMI_RESOLVE
    if (!hami_musa.musaMalloc && !hami_musa.musaGetDevice) {
        HAMI_LOG(HAMI_LOG_ERROR, "cannot find the MUSA runtime (libmusart.so): its calls fail cleanly");
        atomic_store_explicit(&g_state, -1, memory_order_release);
        return;
    }
    const void *probe = hami_musa.musaGetDevice ? (void *)hami_musa.musaGetDevice : (void *)hami_musa.musaMalloc;
    hami_iso_object_range(probe, &g_lo, &g_hi);
    hami_iso_object_range((const void *)&load_once, &g_self_lo, &g_self_hi);
    int count = 0;
    if (hami_musa.musaGetDeviceCount && hami_musa.musaGetDeviceCount(&count) == musaSuccess)
        hami_iso_set_device_count(count);
    atomic_store_explicit(&g_state, 1, memory_order_release);
}

int hami_musa_load(void) {
    int state = atomic_load_explicit(&g_state, memory_order_acquire);
    if (HAMI_LIKELY(state)) return state > 0;
    pthread_once(&g_once, load_once);
    return atomic_load_explicit(&g_state, memory_order_acquire) > 0;
}

/* A return address inside the runtime, or inside this library: a runtime function that tail-calls one of its
 * exported functions makes that call return into the hook that called the runtime (the runtime hooks never call
 * each other, so this is the runtime calling itself). */
int hami_musa_from_runtime(const void *caller) {
    uintptr_t a = (uintptr_t)caller;
    return (a >= g_lo && a < g_hi) || (a >= g_self_lo && a < g_self_hi);
}

int hami_musa_device(void) {
    if (HAMI_LIKELY(t_device.valid)) return t_device.device;
    int device = 0;
    if (hami_musa.musaGetDevice && hami_musa.musaGetDevice(&device) == musaSuccess && device >= 0) {
        t_device.device = device;
        t_device.valid = 1;
        return device;
    }
    return 0;
}

HAMI_EXPORT musaError_t musaSetDevice(int device) {
    HAMI_MUSA_ENTER(musaSetDevice);
    musaError_t r = hami_musa.musaSetDevice(device);
    t_device.valid = 0;
    return r;
}
