/*
 * runtime.c: how calls reach libvmlu.so, and how libvmlu.so reaches the real CNDrv and CNRT.
 *
 * Ways in: the exported hooks (libvmlu.so is loaded through a bind-mounted /etc/ld.so.preload, so it comes first
 * in the global lookup scope and every reference to a hooked name binds to it), and cnGetExportFunction, CNDrv's
 * private lookup (the analogue of cuGetProcAddress, which CNRT and frameworks may use to reach CNDrv's entry
 * points), which answers with the hook for every hooked name. dlvsym, dlopen and dlmopen are the core's
 * (lookup.c). An application that dlopens CNDrv privately and looks names up on that handle is not seen: the limit
 * of every preload-based library.
 *
 * Counting once: CNRT is built on CNDrv, so cnrtMalloc may reach cnMalloc (through the PLT or through
 * cnGetExportFunction). Every hook checks its caller's return address against the mapped ranges of the real
 * libcndrv.so and libcnrt.so (found once, with the core's hami_iso_object_range) and of libvmlu.so itself, and
 * passes a call from inside them straight to the real function: the allocation is counted at the API the
 * application called.
 *
 * Ways out: the real functions are resolved on the first hooked call, never at load time (the core's
 * hami_iso_resolve: dlsym(RTLD_NEXT), another interposer first, as it should), else the library opened by name
 * (libcndrv.so, libcnrt.so, then Neuware's /usr/local/neuware/lib64). Neither library: every hook answers its
 * API's "not initialized" code; a function the installed library lacks, its "not supported" code.
 *
 * Also here: cnrtSetDevice (it keeps the per-thread device cache honest), cnGetExportFunction, and the hook table
 * the core's dlsym and dlvsym ask (hami_iso_hook_for_symbol).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>

#include "vmlu.h"

struct hami_vmlu_real hami_real;
_Atomic int hami_vmlu_state;
uintptr_t hami_vmlu_lo[HAMI_VMLU_RANGES], hami_vmlu_hi[HAMI_VMLU_RANGES];
_Thread_local struct hami_vmlu_thread hami_vmlu_tls __attribute__((tls_model("initial-exec")));

static const hami_iso_vendor g_vendor = {
    .name = "cambricon",
    .memory_limit_env = "CAMBRICON_DEVICE_MEMORY_LIMIT",
    .core_limit_env = "CAMBRICON_DEVICE_CORE_LIMIT",
    .shared_cache_env = "CAMBRICON_DEVICE_MEMORY_SHARED_CACHE",
    .default_cache_path = "/tmp/vmlushr.cache",
    .oversubscribe_env = "CAMBRICON_OVERSUBSCRIBE",
    .priority_env = "CAMBRICON_TASK_PRIORITY",
    .policy_env = "CAMBRICON_CORE_UTILIZATION_POLICY",
    .log_level_env = "LIBVMLU_LOG_LEVEL",
    .visible_devices_env = "CAMBRICON_DEVICE_UUIDS",
    .stream_capturing = NULL,
};

static const char *const CNDRV[] = {"libcndrv.so", "/usr/local/neuware/lib64/libcndrv.so"};
static const char *const CNRT[] = {"libcnrt.so", "/usr/local/neuware/lib64/libcnrt.so"};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void load_once(void) {
    hami_iso_init(&g_vendor);
    void *cndrv = NULL, *cnrt = NULL;
#define HAMI_RESOLVE_CN(name) hami_real.name = (__typeof__(hami_real.name))hami_iso_resolve(&cndrv, CNDRV, 2, #name);
#define HAMI_RESOLVE_CNRT(name) hami_real.name = (__typeof__(hami_real.name))hami_iso_resolve(&cnrt, CNRT, 2, #name);
    HAMI_CN_HOOKS(HAMI_RESOLVE_CN)
    HAMI_CN_CALLS(HAMI_RESOLVE_CN)
    HAMI_CNRT_HOOKS(HAMI_RESOLVE_CNRT)
    HAMI_CNRT_CALLS(HAMI_RESOLVE_CNRT)
#undef HAMI_RESOLVE_CN
#undef HAMI_RESOLVE_CNRT
    if (!hami_real.cnMalloc && !hami_real.cnrtMalloc) {
        HAMI_LOG(HAMI_LOG_ERROR, "cannot find CNDrv (libcndrv.so) nor CNRT (libcnrt.so): MLU calls fail cleanly");
        atomic_store_explicit(&hami_vmlu_state, -1, memory_order_release);
        return;
    }
    hami_iso_object_range((const void *)hami_real.cnMalloc, &hami_vmlu_lo[0], &hami_vmlu_hi[0]);
    hami_iso_object_range((const void *)hami_real.cnrtMalloc, &hami_vmlu_lo[1], &hami_vmlu_hi[1]);
    hami_iso_object_range((const void *)&load_once, &hami_vmlu_lo[2], &hami_vmlu_hi[2]);
    int count = 0;
    unsigned int rt_count = 0;
    if (hami_real.cnrtGetDeviceCount && hami_real.cnrtGetDeviceCount(&rt_count) == cnrtSuccess)
        count = (int)rt_count;
    else if (hami_real.cnDeviceGetCount && hami_real.cnDeviceGetCount(&count) != CN_SUCCESS)
        count = 0;
    if (count > 0) hami_iso_set_device_count(count);
    atomic_store_explicit(&hami_vmlu_state, 1, memory_order_release);
}

int hami_vmlu_load(void) {
    pthread_once(&g_once, load_once);
    return atomic_load_explicit(&hami_vmlu_state, memory_order_acquire) > 0;
}

int hami_vmlu_refresh_device(void) {
    struct hami_vmlu_thread *t = &hami_vmlu_tls;
    int device = 0;
    CNdev dev = 0;
    if (!hami_vmlu_runtime()) return 0;
    if (hami_real.cnrtGetDevice && hami_real.cnrtGetDevice(&device) == cnrtSuccess && device >= 0) {
        t->device = device;
        t->valid = 1;
        return device;
    }
    if (hami_real.cnCtxGetDevice && hami_real.cnCtxGetDevice(&dev) == CN_SUCCESS) return (int)dev;
    return 0;
}

HAMI_EXPORT cnrtRet_t cnrtSetDevice(int ordinal) {
    HAMI_CNRT_ENTER(cnrtSetDevice);
    cnrtRet_t r = hami_real.cnrtSetDevice(ordinal);
    hami_vmlu_tls.valid = 0;
    return r;
}

void *hami_iso_hook_for_symbol(const char *name) {
    if (!name) return NULL;
    HAMI_CN_HOOKS(HAMI_ISO_HOOK_MATCH)
    HAMI_CNRT_HOOKS(HAMI_ISO_HOOK_MATCH)
    return NULL;
}

HAMI_EXPORT CNresult cnGetExportFunction(const char *name, const void **func) {
    HAMI_CN_ENTER(cnGetExportFunction);
    CNresult r = hami_real.cnGetExportFunction(name, func);
    if (r == CN_SUCCESS && func && *func && !FROM_INSIDE()) {
        void *hook = hami_iso_hook_for_symbol(name);
        if (hook) *func = hook;
    }
    return r;
}
