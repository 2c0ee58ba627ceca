/*
 * runtime.c: how calls reach libvnpu.so, and how libvnpu.so reaches the real runtime and AscendCL.
 *
 * Ways in: the exported hooks. Being preloaded (/etc/ld.so.preload), libvnpu.so is first in the global lookup
 * scope, so every reference to a hooked name binds to it: the application's own, and libascendcl.so's calls into
 * libruntime.so, even when the application loaded libascendcl.so itself with dlopen(RTLD_LOCAL) and looks its
 * functions up with dlsym on that handle (PyTorch's Ascend backend does). That is why the runtime layer is where
 * memory and launches are counted: whatever AscendCL entry point an application uses, its device memory and its
 * work pass a runtime function. AscendCL functions are hooked as well, for the versions where one does not reach
 * a hooked runtime function; memory.c and launch.c make sure nothing is counted twice.
 * The linker's lookups are the core's (lookup.c), answered from the hook table at the end of this file: dlsym on
 * any handle (libruntime.so opened privately included), dlvsym with any version, RTLD_DEEPBIND, dlmopen.
 *
 * Ways out: the real functions are resolved on the first hooked call of their library, never at load time (a
 * runtime loaded later by dlopen is then found): by the core's hami_iso_resolve, dlsym(RTLD_NEXT), which finds
 * them in the global scope after us (another interposer first, as it should), else in libruntime.so /
 * libascendcl.so opened by name (already loaded, even privately, or loaded now). A missing library makes every
 * hook of it return ACL_ERROR_RT_INTERNAL_ERROR (507000); a function the installed version lacks,
 * ACL_ERROR_RT_FEATURE_NOT_SUPPORT.
 *
 * Also here: the hooks that change the calling thread's device (rtSetDevice, aclrtSetDevice, and setting a
 * context), which keep the per-thread device cache honest.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "vnpu.h"

struct hami_vnpu_real hami_real;
_Atomic int hami_vnpu_runtime_state;
_Atomic int hami_vnpu_acl_state;
_Thread_local struct hami_vnpu_thread hami_vnpu_tls __attribute__((tls_model("initial-exec")));

static const hami_iso_vendor g_vendor = {
    .name = "ascend",
    .memory_limit_env = "ASCEND_DEVICE_MEMORY_LIMIT",
    .core_limit_env = "ASCEND_DEVICE_CORE_LIMIT",
    .shared_cache_env = "ASCEND_DEVICE_MEMORY_SHARED_CACHE",
    .default_cache_path = "/tmp/vnpushr.cache",
    .oversubscribe_env = "ASCEND_OVERSUBSCRIBE",
    .priority_env = "ASCEND_TASK_PRIORITY",
    .policy_env = "ASCEND_CORE_UTILIZATION_POLICY",
    .log_level_env = "LIBVNPU_LOG_LEVEL",
    .visible_devices_env = "ASCEND_DEVICE_UUIDS",
    .stream_capturing = NULL,
};

/* The real function `name` of the library called `soname`: the next definition in the global scope, else the
 * library's own (opened by name: found if already loaded anywhere, loaded otherwise). */
static void *resolve(void **library, const char *soname, const char *name) {
    return hami_iso_resolve(library, &soname, 1, name);
}

static pthread_once_t g_runtime_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_acl_once = PTHREAD_ONCE_INIT;

static void load_runtime_once(void) {
    hami_iso_init(&g_vendor);
    void *library = NULL;
#define HAMI_RESOLVE(name) hami_real.name = (__typeof__(hami_real.name))resolve(&library, "libruntime.so", #name);
    HAMI_RT_HOOKS(HAMI_RESOLVE)
    HAMI_RT_CALLS(HAMI_RESOLVE)
#undef HAMI_RESOLVE
    if (!hami_real.rtMalloc && !hami_real.rtGetDevice) {
        HAMI_LOG(HAMI_LOG_ERROR, "cannot find the Ascend runtime libruntime.so (%s): runtime calls fail cleanly",
                 library ? "it lacks rtMalloc and rtGetDevice" : dlerror());
        atomic_store_explicit(&hami_vnpu_runtime_state, -1, memory_order_release);
        return;
    }
    int32_t count = 0;
    if (hami_real.rtGetDeviceCount && hami_real.rtGetDeviceCount(&count) == RT_ERROR_NONE)
        hami_iso_set_device_count(count);
    atomic_store_explicit(&hami_vnpu_runtime_state, 1, memory_order_release);
}

static void load_acl_once(void) {
    hami_iso_init(&g_vendor);
    void *library = NULL;
#define HAMI_RESOLVE(name) hami_real.name = (__typeof__(hami_real.name))resolve(&library, "libascendcl.so", #name);
    HAMI_ACL_HOOKS(HAMI_RESOLVE)
#undef HAMI_RESOLVE
    if (!hami_real.aclrtMalloc && !hami_real.aclrtSetDevice) {
        HAMI_LOG(HAMI_LOG_ERROR, "cannot find AscendCL libascendcl.so (%s): AscendCL calls fail cleanly",
                 library ? "it lacks aclrtMalloc and aclrtSetDevice" : dlerror());
        atomic_store_explicit(&hami_vnpu_acl_state, -1, memory_order_release);
        return;
    }
    atomic_store_explicit(&hami_vnpu_acl_state, 1, memory_order_release);
    hami_vnpu_load_runtime(); /* the device queries and events are the runtime's */
}

int hami_vnpu_load_runtime(void) {
    pthread_once(&g_runtime_once, load_runtime_once);
    return atomic_load_explicit(&hami_vnpu_runtime_state, memory_order_acquire) > 0;
}

int hami_vnpu_load_acl(void) {
    pthread_once(&g_acl_once, load_acl_once);
    return atomic_load_explicit(&hami_vnpu_acl_state, memory_order_acquire) > 0;
}

/* ------------------------------------------------------------------------------------------------------ */
/* The calling thread's device                                                                               */
/* ------------------------------------------------------------------------------------------------------ */

int hami_vnpu_refresh_device(void) {
    struct hami_vnpu_thread *t = &hami_vnpu_tls;
    int32_t device = 0;
    if (hami_vnpu_runtime() && hami_real.rtGetDevice && hami_real.rtGetDevice(&device) == RT_ERROR_NONE &&
        device >= 0) {
        t->device = device;
        t->valid = 1;
        return device;
    }
    return 0; /* no device set: the runtime refuses the call anyway */
}

HAMI_EXPORT rtError_t rtSetDevice(int32_t devId) {
    HAMI_RT_ENTER(rtSetDevice);
    rtError_t r = hami_real.rtSetDevice(devId);
    hami_vnpu_device_changed();
    return r;
}

HAMI_EXPORT rtError_t rtCtxSetCurrent(rtContext_t ctx) {
    HAMI_RT_ENTER(rtCtxSetCurrent);
    rtError_t r = hami_real.rtCtxSetCurrent(ctx);
    hami_vnpu_device_changed();
    return r;
}

HAMI_EXPORT aclError aclrtSetDevice(int32_t deviceId) {
    HAMI_ACL_ENTER(aclrtSetDevice);
    aclError r = hami_real.aclrtSetDevice(deviceId);
    hami_vnpu_device_changed();
    return r;
}

HAMI_EXPORT aclError aclrtSetCurrentContext(aclrtContext context) {
    HAMI_ACL_ENTER(aclrtSetCurrentContext);
    aclError r = hami_real.aclrtSetCurrentContext(context);
    hami_vnpu_device_changed();
    return r;
}

/* The hook table the core's dlsym and dlvsym answer (lookup.c): dlsym(handle, "rtMalloc") on libruntime.so opened
 * privately answers the hook, as every other way to a hooked name does. */
void *hami_iso_hook_for_symbol(const char *name) {
    if (!name) return NULL;
    HAMI_RT_HOOKS(HAMI_ISO_HOOK_MATCH)
    HAMI_ACL_HOOKS(HAMI_ISO_HOOK_MATCH)
    return NULL;
}
