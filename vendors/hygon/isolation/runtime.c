/*
 * runtime.c: how calls reach libvdcu.so, and how libvdcu.so reaches the real HIP runtime.
 *
 * Ways in: the exported hooks. libvdcu.so is loaded through a bind-mounted /etc/ld.so.preload, so it is first in
 * the global lookup scope and every reference an application (or a framework library linked against HIP) makes to
 * a hooked name binds to it; and hipGetProcAddress, the runtime's own lookup path, answers with the hook for every
 * hooked name. An application that dlopens the runtime privately and looks names up on that handle is not seen:
 * the same limit as every preload-based library (and as LD_AUDIT's la_symbind, which also sees only bindings).
 *
 * Why preload and not LD_AUDIT (HAMi's AMD library uses LD_AUDIT because a preloaded library broke HIP's
 * initialisation on recent ROCm): the failure comes from HIP calling its own exported functions through the global
 * scope during start-up and meeting the interposer there. Here every hook checks its caller's return address
 * against the real runtime's mapped range (found once, with the core's hami_iso_object_range) and passes a call
 * from inside HIP straight to the real function: HIP's internal calls never reach the accounting, which is the rule
 * LD_AUDIT's "redirect only bindings whose caller is not HIP" gives. Preload is kept because it is enforced from
 * outside the tenant's processes (a read-only mounted file), whereas LD_AUDIT can only be set through the
 * environment, which any process of the container may drop for its children.
 *
 * Ways out: the real functions are resolved on the first hooked call, never at load time (a runtime loaded later
 * is then found), through the core's hami_iso_resolve: dlsym(RTLD_NEXT) (another interposer first, as it should),
 * else DTK's runtime opened by name (libgalaxyhip.so.5, libgalaxyhip.so, then the upstream name libamdhip64.so some
 * DTK builds also ship). No runtime:
 * every hook answers hipErrorNotInitialized; a function the installed runtime lacks, hipErrorNotSupported.
 *
 * Also here: hipSetDevice, which keeps the per-thread device cache honest, and hipGetProcAddress.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>

#include "vdcu.h"

struct hami_vdcu_real hami_real;
_Atomic int hami_vdcu_state;
uintptr_t hami_vdcu_hip_lo, hami_vdcu_hip_hi, hami_vdcu_self_lo, hami_vdcu_self_hi;
_Thread_local struct hami_vdcu_thread hami_vdcu_tls __attribute__((tls_model("initial-exec")));

static int stream_capturing(void *stream) {
    hipStreamCaptureStatus status = 0;
    if (!hami_real.hipStreamIsCapturing) return 0;
    return hami_real.hipStreamIsCapturing((hipStream_t)stream, &status) == hipSuccess && status != 0;
}

static const hami_iso_vendor g_vendor = {
    .name = "hygon",
    .memory_limit_env = "HIP_DEVICE_MEMORY_LIMIT",
    .core_limit_env = "HIP_DEVICE_CORE_LIMIT",
    .shared_cache_env = "HIP_DEVICE_MEMORY_SHARED_CACHE",
    .default_cache_path = "/tmp/vdcushr.cache",
    .oversubscribe_env = "HIP_OVERSUBSCRIBE",
    .priority_env = "HIP_TASK_PRIORITY",
    .policy_env = "HIP_CORE_UTILIZATION_POLICY",
    .log_level_env = "LIBVDCU_LOG_LEVEL",
    .visible_devices_env = "HIP_DEVICE_UUIDS",
    .stream_capturing = stream_capturing,
};

static const char *const RUNTIMES[] = {"libgalaxyhip.so.5", "libgalaxyhip.so", "libamdhip64.so"};

static void *resolve(void **library, const char *name) {
    return hami_iso_resolve(library, RUNTIMES, sizeof RUNTIMES / sizeof *RUNTIMES, name);
}

/* HIP's range, and this library's own: a real function that tail-calls one of its exported functions makes that
 * call return into the hook that called the real function, so a return address inside libvdcu.so also means
 * "from inside HIP" (the hooks never call each other). */
static void find_hip_range(void) {
    hami_iso_object_range(hami_real.hipMalloc ? (void *)hami_real.hipMalloc : (void *)hami_real.hipGetDevice,
                          &hami_vdcu_hip_lo, &hami_vdcu_hip_hi);
    hami_iso_object_range((const void *)&find_hip_range, &hami_vdcu_self_lo, &hami_vdcu_self_hi);
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void load_once(void) {
    hami_iso_init(&g_vendor);
    void *library = NULL;
#define HAMI_RESOLVE(name) hami_real.name = (__typeof__(hami_real.name))resolve(&library, #name);
    HAMI_HIP_HOOKS(HAMI_RESOLVE)
    HAMI_HIP_CALLS(HAMI_RESOLVE)
#undef HAMI_RESOLVE
    if (!hami_real.hipMalloc && !hami_real.hipGetDevice) {
        HAMI_LOG(HAMI_LOG_ERROR, "cannot find the HIP runtime (libgalaxyhip.so): HIP calls fail cleanly");
        atomic_store_explicit(&hami_vdcu_state, -1, memory_order_release);
        return;
    }
    find_hip_range();
    int count = 0;
    if (hami_real.hipGetDeviceCount && hami_real.hipGetDeviceCount(&count) == hipSuccess)
        hami_iso_set_device_count(count);
    atomic_store_explicit(&hami_vdcu_state, 1, memory_order_release);
}

int hami_vdcu_load(void) {
    pthread_once(&g_once, load_once);
    return atomic_load_explicit(&hami_vdcu_state, memory_order_acquire) > 0;
}

int hami_vdcu_refresh_device(void) {
    struct hami_vdcu_thread *t = &hami_vdcu_tls;
    int device = 0;
    if (hami_vdcu_runtime() && hami_real.hipGetDevice && hami_real.hipGetDevice(&device) == hipSuccess &&
        device >= 0) {
        t->device = device;
        t->valid = 1;
        return device;
    }
    return 0;
}

HAMI_EXPORT hipError_t hipSetDevice(int deviceId) {
    HAMI_HIP_ENTER(hipSetDevice);
    hipError_t r = hami_real.hipSetDevice(deviceId);
    hami_vdcu_tls.valid = 0;
    return r;
}

void *hami_vdcu_hook_of(const char *name) {
#define HAMI_MATCH(hook)                                                                                       \
    if (!strcmp(name, #hook)) return (void *)&hook;
    HAMI_HIP_HOOKS(HAMI_MATCH)
#undef HAMI_MATCH
    return NULL;
}

HAMI_EXPORT hipError_t hipGetProcAddress(const char *symbol, void **pfn, int hipVersion, uint64_t flags,
                                         int *symbolStatus) {
    HAMI_HIP_ENTER(hipGetProcAddress);
    hipError_t r = hami_real.hipGetProcAddress(symbol, pfn, hipVersion, flags, symbolStatus);
    if (r == hipSuccess && pfn && *pfn && symbol && !hami_vdcu_from_hip(__builtin_return_address(0))) {
        void *hook = hami_vdcu_hook_of(symbol);
        if (hook) *pfn = hook;
    }
    return r;
}
