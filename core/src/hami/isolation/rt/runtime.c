/*
 * runtime.c: how calls reach the library, and how the library reaches the real runtime.
 *
 * Ways in: the exported hooks. The library is loaded through a bind-mounted /etc/ld.so.preload, so it is first in
 * the global lookup scope and every reference an application (or a framework library linked against the runtime)
 * makes to a hooked name binds to it; where the runtime has one (HAMI_RT_HAS_PROC_ADDRESS), its own lookup
 * GetProcAddress, which answers with the hook for every hooked name; and the linker's lookups, which the core's
 * lookup.c answers with the hook table below (hami_iso_hook_for_symbol): dlsym on any handle (the runtime opened
 * privately with RTLD_LOCAL included), dlvsym with any version string, dlopen with RTLD_DEEPBIND (loaded without
 * it) and dlmopen into a new namespace (refused). The vendor's version script exports `dlsym; dlvsym; dlopen;
 * dlmopen;` beside the hooks.
 *
 * Why preload and not LD_AUDIT (HAMi's AMD library uses LD_AUDIT because a preloaded library broke HIP's
 * initialisation on recent ROCm): the failure comes from the runtime calling its own exported functions through
 * the global scope during start-up and meeting the interposer there. Here every hook checks its caller's return
 * address against the real runtime's mapped range (found once, with dl_iterate_phdr) and passes a call from inside
 * the runtime straight to the real function: the runtime's internal calls never reach the accounting, which is
 * exactly the rule LD_AUDIT's "redirect only bindings whose caller is not the runtime" gives. Preload is kept
 * because it is enforced from outside the tenant's processes (a read-only mounted file), whereas LD_AUDIT can only
 * be set through the environment, which any process of the container may drop for its children.
 *
 * Ways out: the real functions are resolved on the first hooked call, never at load time (a runtime loaded later
 * is then found), by the core's hami_iso_resolve: the real dlsym(RTLD_NEXT) (another interposer first, as it
 * should), else the vendor's runtime opened by name (HAMI_RT_LIBRARIES, in order). No runtime: every hook answers "not initialized"; a function the installed
 * runtime lacks, the vendor's "not supported".
 *
 * Also here: SetDevice, which keeps the per-thread device cache honest, and GetProcAddress.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "hami_rt.h"

struct hami_rt_real hami_rt_fn;
_Atomic int hami_rt_state;
uintptr_t hami_rt_lo, hami_rt_hi, hami_rt_self_lo, hami_rt_self_hi;
_Thread_local struct hami_rt_thread hami_rt_tls __attribute__((tls_model("initial-exec")));

static int stream_capturing(void *stream) {
    int status = 0;
    if (!hami_rt_fn.StreamIsCapturing) return 0;
    return hami_rt_fn.StreamIsCapturing(stream, &status) == HAMI_RT_SUCCESS && status != 0;
}

static const hami_iso_vendor g_vendor = {
    .name = HAMI_RT_VENDOR_NAME,
    .memory_limit_env = HAMI_RT_ENV_MEMORY_LIMIT,
    .core_limit_env = HAMI_RT_ENV_CORE_LIMIT,
    .shared_cache_env = HAMI_RT_ENV_SHARED_CACHE,
    .default_cache_path = HAMI_RT_DEFAULT_CACHE,
    .oversubscribe_env = HAMI_RT_ENV_OVERSUBSCRIBE,
    .priority_env = HAMI_RT_ENV_PRIORITY,
    .policy_env = HAMI_RT_ENV_POLICY,
    .log_level_env = HAMI_RT_ENV_LOG_LEVEL,
    .visible_devices_env = HAMI_RT_ENV_UUIDS,
    .stream_capturing = stream_capturing,
};

static const char *const RUNTIMES[] = {HAMI_RT_LIBRARIES};

static void *resolve(void **library, const char *name) {
    return hami_iso_resolve(library, RUNTIMES, sizeof RUNTIMES / sizeof *RUNTIMES, name);
}

/* The mapped range of the object loaded at `base` (all its PT_LOAD segments). */
/* The runtime's range, and this library's own: a real function that tail-calls one of its exported functions makes
 * that call return into the hook that called the real function, so a return address inside this library also means
 * "from inside the runtime" (the hooks never call each other). */
static void find_runtime_range(void) {
    const void *probe = hami_rt_fn.Malloc ? (void *)hami_rt_fn.Malloc : (void *)hami_rt_fn.GetDevice;
    hami_iso_object_range(probe, &hami_rt_lo, &hami_rt_hi);
    hami_iso_object_range((const void *)&find_runtime_range, &hami_rt_self_lo, &hami_rt_self_hi);
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void load_once(void) {
    hami_iso_init(&g_vendor);
    void *library = NULL;
#define HAMI_RT_RESOLVE(name) hami_rt_fn.name = (__typeof__(hami_rt_fn.name))resolve(&library, HAMI_RT_PREFIX #name);
    HAMI_RT_HOOKS(HAMI_RT_RESOLVE)
    HAMI_RT_CALLS(HAMI_RT_RESOLVE)
#undef HAMI_RT_RESOLVE
    if (!hami_rt_fn.Malloc && !hami_rt_fn.GetDevice) {
        HAMI_LOG(HAMI_LOG_ERROR, "cannot find the %s runtime (%s): its calls fail cleanly", HAMI_RT_VENDOR_NAME,
                 RUNTIMES[0]);
        atomic_store_explicit(&hami_rt_state, -1, memory_order_release);
        return;
    }
    find_runtime_range();
    int count = 0;
    if (hami_rt_fn.GetDeviceCount && hami_rt_fn.GetDeviceCount(&count) == HAMI_RT_SUCCESS) hami_iso_set_device_count(count);
    atomic_store_explicit(&hami_rt_state, 1, memory_order_release);
}

int hami_rt_load(void) {
    pthread_once(&g_once, load_once);
    return atomic_load_explicit(&hami_rt_state, memory_order_acquire) > 0;
}

int hami_rt_refresh_device(void) {
    struct hami_rt_thread *t = &hami_rt_tls;
    int device = 0;
    if (hami_rt_runtime() && hami_rt_fn.GetDevice && hami_rt_fn.GetDevice(&device) == HAMI_RT_SUCCESS && device >= 0) {
        t->device = device;
        t->valid = 1;
        return device;
    }
    return 0;
}

HAMI_EXPORT hami_rt_error HAMI_RT(SetDevice)(int deviceId) {
    HAMI_RT_ENTER(SetDevice);
    hami_rt_error r = hami_rt_fn.SetDevice(deviceId);
    hami_rt_tls.valid = 0;
    return r;
}

void *hami_rt_hook_of(const char *name) {
    size_t prefix = sizeof HAMI_RT_PREFIX - 1;
    if (!name || strncmp(name, HAMI_RT_PREFIX, prefix) != 0) return NULL;
    name += prefix;
#define HAMI_RT_MATCH(hook)                                                                                    \
    if (!strcmp(name, #hook)) return (void *)&HAMI_RT(hook);
    HAMI_RT_HOOKS(HAMI_RT_MATCH)
#undef HAMI_RT_MATCH
    return NULL;
}

/* The hook table the core's dlsym and dlvsym answer (lookup.c). Weak: a library built on this layer and the
 * CUDA-compatible one (MUSA's runtime beside its driver) answers through that layer's table, which asks
 * hami_rt_hook_of for the runtime's names. */
__attribute__((weak)) void *hami_iso_hook_for_symbol(const char *name) { return hami_rt_hook_of(name); }

#if defined(HAMI_RT_HAS_PROC_ADDRESS) && HAMI_RT_HAS_PROC_ADDRESS
HAMI_EXPORT hami_rt_error HAMI_RT(GetProcAddress)(const char *symbol, void **pfn, int version, uint64_t flags,
                                                  int *symbolStatus) {
    HAMI_RT_ENTER(GetProcAddress);
    hami_rt_error r = hami_rt_fn.GetProcAddress(symbol, pfn, version, flags, symbolStatus);
    if (r == HAMI_RT_SUCCESS && pfn && *pfn && symbol && !hami_rt_from_runtime(__builtin_return_address(0))) {
        void *hook = hami_rt_hook_of(symbol);
        if (hook) *pfn = hook;
    }
    return r;
}
#endif
