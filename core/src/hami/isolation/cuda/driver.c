/*
 * driver.c: how calls reach the vendor's isolation library, and how it reaches the real driver.
 * Names below are CUDA's; the vendor's own (HAMI_CU) are what is hooked and looked up.
 *
 * Three ways in, all covered: the exported wrappers (a program linked against the driver binds to ours
 * first, since we are preloaded), the linker's lookups (the core's lookup.c: dlsym, dlvsym, RTLD_DEEPBIND and
 * dlmopen, answered from the hook table below), and cuGetProcAddress / cuGetProcAddress_v2 (the real driver answers for
 * the requested version and stream flags; its answer is swapped for the hook of the same function, matched by
 * address, or by name and version when the driver hands out internal addresses).
 *
 * The real driver and management library (HAMI_CUDA_DRIVER_LIBRARIES, HAMI_CUDA_NVML_LIBRARIES: the first of
 * each list that loads and has the functions) are opened on the first hooked call, never at load time. When one
 * is missing every hook returns a clean error (CUDA_ERROR_NOT_INITIALIZED, NVML_ERROR_LIBRARY_NOT_FOUND), and
 * a function the installed driver lacks returns CUDA_ERROR_NOT_FOUND / NVML_ERROR_FUNCTION_NOT_FOUND.
 *
 * Also here: cuInit, and the context hooks that keep the per-thread current device cached and release the
 * memory of a destroyed context.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "hami_cuda.h"

struct hami_cu_real hami_real;
_Atomic int hami_cu_cuda_state;
_Atomic int hami_cu_nvml_state;
_Thread_local struct hami_cu_thread hami_cu_tls __attribute__((tls_model("initial-exec")));

static const hami_iso_vendor g_vendor = {
    .name = HAMI_CUDA_VENDOR_NAME,
    .memory_limit_env = HAMI_CUDA_ENV_MEMORY_LIMIT,
    .core_limit_env = HAMI_CUDA_ENV_CORE_LIMIT,
    .shared_cache_env = HAMI_CUDA_ENV_SHARED_CACHE,
    .default_cache_path = HAMI_CUDA_DEFAULT_CACHE,
    .oversubscribe_env = HAMI_CUDA_ENV_OVERSUBSCRIBE,
    .priority_env = HAMI_CUDA_ENV_PRIORITY,
    .policy_env = HAMI_CUDA_ENV_POLICY,
    .log_level_env = HAMI_CUDA_ENV_LOG_LEVEL,
    .visible_devices_env = HAMI_CUDA_ENV_VISIBLE_DEVICES,
    .stream_capturing = hami_cu_stream_capturing,
    .device_busy = hami_cu_device_busy,
    .process_memory = hami_cu_process_memory,
};

/* ------------------------------------------------------------------------------------------------------ */
/* The real dlsym                                                                                           */
/* ------------------------------------------------------------------------------------------------------ */

typedef hami_iso_dlsym_fn dlsym_fn;

static inline dlsym_fn real_dlsym(void) { return hami_iso_real_dlsym(); } /* the core's dlsym answers hooks */

void *hami_cu_real_symbol(void *handle, const char *name) {
    dlsym_fn lookup = real_dlsym();
    return lookup ? lookup(handle, name) : NULL;
}

/* ------------------------------------------------------------------------------------------------------ */
/* Hook tables                                                                                              */
/* ------------------------------------------------------------------------------------------------------ */

struct hook {
    const char *name;
    void *hook;
};

static const struct hook g_hooks[] = {
#define HAMI_ENTRY(name) {HAMI_STR(name), (void *)&name},
    HAMI_CUDA_HOOKS(HAMI_ENTRY) HAMI_NVML_HOOKS(HAMI_ENTRY)
#undef HAMI_ENTRY
};
#define HOOK_COUNT (sizeof g_hooks / sizeof *g_hooks)

/* The vendor's own hooks (HAMI_CUDA_VENDOR_HOOKS, defined in its sources beside the layer's): answered by dlsym
 * and dlvsym like the layer's. */
static const struct hook g_vendor_hooks[] = {
#define HAMI_ENTRY(name) {HAMI_STR(name), (void *)&name},
    HAMI_CUDA_VENDOR_HOOKS(HAMI_ENTRY){NULL, NULL},
#undef HAMI_ENTRY
};

static const char g_prefix[] = HAMI_STR(HAMI_CU(_)); /* the vendor's prefix and "_": "cu_" */

/* The CUDA-runtime-shaped layer's hooks (../rt), where the library is built on both layers (MUSA's). */
__attribute__((weak)) void *hami_rt_hook_of(const char *name);

static void *hook_by_name(const char *name) {
    if (!name) return NULL;
    void *runtime_hook = hami_rt_hook_of ? hami_rt_hook_of(name) : NULL;
    if (runtime_hook) return runtime_hook;
    if (!strncmp(name, g_prefix, sizeof g_prefix - 2) || !strncmp(name, "nvml", 4))
        for (size_t i = 0; i < HOOK_COUNT; i++)
            if (!strcmp(g_hooks[i].name, name)) return g_hooks[i].hook;
    for (const struct hook *h = g_vendor_hooks; h->name; h++)
        if (!strcmp(h->name, name)) return h->hook;
    return NULL;
}

/* The hook table the core's dlsym and dlvsym answer (lookup.c). */
void *hami_iso_hook_for_symbol(const char *name) { return hook_by_name(name); }

/* The driver's address of each hooked function, paired with our hook (filled when the driver is loaded). */
static void *g_real_of_hook[HOOK_COUNT];

/* Which exported variant cuGetProcAddress returns for a name, by CUDA version and stream flags. Used when the
 * driver's answer is not one of its exported functions. */
struct variant {
    const char *name;
    int version;
    int per_thread;
    const char *symbol;
};

static const struct variant g_variants[] = {
    {HAMI_STR(HAMI_CU(Init)), 2000, 0, HAMI_STR(HAMI_CU(Init))},
    {HAMI_STR(HAMI_CU(GetProcAddress)), 11030, 0, HAMI_STR(HAMI_CU(GetProcAddress))},
    {HAMI_STR(HAMI_CU(GetProcAddress)), 12000, 0, HAMI_STR(HAMI_CU(GetProcAddress_v2))},
    {HAMI_STR(HAMI_CU(MemAlloc)), 3020, 0, HAMI_STR(HAMI_CU(MemAlloc_v2))},
    {HAMI_STR(HAMI_CU(MemAllocPitch)), 3020, 0, HAMI_STR(HAMI_CU(MemAllocPitch_v2))},
    {HAMI_STR(HAMI_CU(MemAllocManaged)), 6000, 0, HAMI_STR(HAMI_CU(MemAllocManaged))},
    {HAMI_STR(HAMI_CU(MemFree)), 3020, 0, HAMI_STR(HAMI_CU(MemFree_v2))},
    {HAMI_STR(HAMI_CU(MemCreate)), 10020, 0, HAMI_STR(HAMI_CU(MemCreate))},
    {HAMI_STR(HAMI_CU(MemRelease)), 10020, 0, HAMI_STR(HAMI_CU(MemRelease))},
    {HAMI_STR(HAMI_CU(MemAllocAsync)), 11020, 0, HAMI_STR(HAMI_CU(MemAllocAsync))},
    {HAMI_STR(HAMI_CU(MemAllocAsync)), 11020, 1, HAMI_STR(HAMI_CU(MemAllocAsync_ptsz))},
    {HAMI_STR(HAMI_CU(MemFreeAsync)), 11020, 0, HAMI_STR(HAMI_CU(MemFreeAsync))},
    {HAMI_STR(HAMI_CU(MemFreeAsync)), 11020, 1, HAMI_STR(HAMI_CU(MemFreeAsync_ptsz))},
    {HAMI_STR(HAMI_CU(MemAllocFromPoolAsync)), 11020, 0, HAMI_STR(HAMI_CU(MemAllocFromPoolAsync))},
    {HAMI_STR(HAMI_CU(MemAllocFromPoolAsync)), 11020, 1, HAMI_STR(HAMI_CU(MemAllocFromPoolAsync_ptsz))},
    {HAMI_STR(HAMI_CU(MemPoolCreate)), 11020, 0, HAMI_STR(HAMI_CU(MemPoolCreate))},
    {HAMI_STR(HAMI_CU(MemPoolDestroy)), 11020, 0, HAMI_STR(HAMI_CU(MemPoolDestroy))},
    {HAMI_STR(HAMI_CU(ArrayCreate)), 3020, 0, HAMI_STR(HAMI_CU(ArrayCreate_v2))},
    {HAMI_STR(HAMI_CU(Array3DCreate)), 3020, 0, HAMI_STR(HAMI_CU(Array3DCreate_v2))},
    {HAMI_STR(HAMI_CU(ArrayDestroy)), 2000, 0, HAMI_STR(HAMI_CU(ArrayDestroy))},
    {HAMI_STR(HAMI_CU(MipmappedArrayCreate)), 5000, 0, HAMI_STR(HAMI_CU(MipmappedArrayCreate))},
    {HAMI_STR(HAMI_CU(MipmappedArrayDestroy)), 5000, 0, HAMI_STR(HAMI_CU(MipmappedArrayDestroy))},
    {HAMI_STR(HAMI_CU(MemGetInfo)), 3020, 0, HAMI_STR(HAMI_CU(MemGetInfo_v2))},
    {HAMI_STR(HAMI_CU(DeviceTotalMem)), 3020, 0, HAMI_STR(HAMI_CU(DeviceTotalMem_v2))},
    {HAMI_STR(HAMI_CU(LaunchKernel)), 4000, 0, HAMI_STR(HAMI_CU(LaunchKernel))},
    {HAMI_STR(HAMI_CU(LaunchKernel)), 7000, 1, HAMI_STR(HAMI_CU(LaunchKernel_ptsz))},
    {HAMI_STR(HAMI_CU(LaunchKernelEx)), 11060, 0, HAMI_STR(HAMI_CU(LaunchKernelEx))},
    {HAMI_STR(HAMI_CU(LaunchKernelEx)), 11060, 1, HAMI_STR(HAMI_CU(LaunchKernelEx_ptsz))},
    {HAMI_STR(HAMI_CU(LaunchCooperativeKernel)), 9000, 0, HAMI_STR(HAMI_CU(LaunchCooperativeKernel))},
    {HAMI_STR(HAMI_CU(LaunchCooperativeKernel)), 9000, 1, HAMI_STR(HAMI_CU(LaunchCooperativeKernel_ptsz))},
    {HAMI_STR(HAMI_CU(GraphLaunch)), 10000, 0, HAMI_STR(HAMI_CU(GraphLaunch))},
    {HAMI_STR(HAMI_CU(GraphLaunch)), 10000, 1, HAMI_STR(HAMI_CU(GraphLaunch_ptsz))},
    {HAMI_STR(HAMI_CU(CtxCreate)), 3020, 0, HAMI_STR(HAMI_CU(CtxCreate_v2))},
    {HAMI_STR(HAMI_CU(CtxCreate)), 11040, 0, HAMI_STR(HAMI_CU(CtxCreate_v3))},
    {HAMI_STR(HAMI_CU(CtxCreate)), 12050, 0, HAMI_STR(HAMI_CU(CtxCreate_v4))},
    {HAMI_STR(HAMI_CU(CtxDestroy)), 4000, 0, HAMI_STR(HAMI_CU(CtxDestroy_v2))},
    {HAMI_STR(HAMI_CU(CtxSetCurrent)), 4000, 0, HAMI_STR(HAMI_CU(CtxSetCurrent))},
    {HAMI_STR(HAMI_CU(CtxPushCurrent)), 4000, 0, HAMI_STR(HAMI_CU(CtxPushCurrent_v2))},
    {HAMI_STR(HAMI_CU(CtxPopCurrent)), 4000, 0, HAMI_STR(HAMI_CU(CtxPopCurrent_v2))},
    {HAMI_STR(HAMI_CU(DevicePrimaryCtxRetain)), 7000, 0, HAMI_STR(HAMI_CU(DevicePrimaryCtxRetain))},
    {HAMI_STR(HAMI_CU(DevicePrimaryCtxReset)), 11000, 0, HAMI_STR(HAMI_CU(DevicePrimaryCtxReset_v2))},
};

static void *hook_by_version(const char *name, int version, cuuint64_t flags) {
    int want = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? 1 : 0;
    const struct variant *best = NULL;
    for (int pass = want; pass >= 0 && !best; pass--)
        for (size_t i = 0; i < sizeof g_variants / sizeof *g_variants; i++) {
            const struct variant *v = &g_variants[i];
            if (v->per_thread != pass || v->version > version || strcmp(v->name, name)) continue;
            if (!best || v->version > best->version) best = v;
        }
    return best ? hook_by_name(best->symbol) : NULL;
}

/* Our hook for what the real cuGetProcAddress answered, or the answer itself for functions we do not hook. */
static void *hook_for_proc(const char *symbol, void *real, int version, cuuint64_t flags) {
    if (!real) return real;
    for (size_t i = 0; i < HOOK_COUNT; i++)
        if (g_real_of_hook[i] == real) return g_hooks[i].hook;
    void *hook = symbol ? hook_by_version(symbol, version, flags) : NULL;
    return hook ? hook : real;
}

/* ------------------------------------------------------------------------------------------------------ */
/* Loading the real libraries                                                                               */
/* ------------------------------------------------------------------------------------------------------ */

static pthread_once_t g_cuda_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_nvml_once = PTHREAD_ONCE_INIT;

/* The first of `names` that loads and has `required` (a library of the same file name that is something else,
 * such as another project's libixml.so, is passed over). */
static void *open_first(const char *const *names, size_t count, const char *required, dlsym_fn lookup,
                        const char **why) {
    *why = lookup ? "not found" : "no dlsym";
    for (size_t i = 0; lookup && i < count; i++) {
        void *library = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!library) {
            const char *error = dlerror();
            if (i == 0 && error) *why = error;
            continue;
        }
        if (lookup(library, required)) return library;
        HAMI_LOG(HAMI_LOG_INFO, "%s has no %s: not the library looked for", names[i], required);
        dlclose(library);
    }
    return NULL;
}

static const char *const g_driver_names[] = {HAMI_CUDA_DRIVER_LIBRARIES};

static void load_cuda_once(void) {
    hami_iso_init(&g_vendor);
    dlsym_fn lookup = real_dlsym();
    const char *why;
    void *library = open_first(g_driver_names, sizeof g_driver_names / sizeof *g_driver_names,
                               HAMI_STR(HAMI_CU(Init)), lookup, &why);
    if (!library) {
        HAMI_LOG(HAMI_LOG_ERROR, "cannot load the driver %s (%s): its calls fail cleanly", g_driver_names[0], why);
        atomic_store_explicit(&hami_cu_cuda_state, -1, memory_order_release);
        return;
    }
#define HAMI_RESOLVE(name) hami_real.name = (__typeof__(hami_real.name))lookup(library, HAMI_STR(name));
    HAMI_CUDA_HOOKS(HAMI_RESOLVE)
    HAMI_CUDA_CALLS(HAMI_RESOLVE)
#undef HAMI_RESOLVE
    size_t i = 0;
#define HAMI_PAIR(name) g_real_of_hook[i++] = (void *)hami_real.name;
    HAMI_CUDA_HOOKS(HAMI_PAIR)
#undef HAMI_PAIR
    atomic_store_explicit(&hami_cu_cuda_state, 1, memory_order_release);
}

#ifdef HAMI_CUDA_NVML_LIBRARIES
static const char *const g_nvml_names[] = {HAMI_CUDA_NVML_LIBRARIES};

static void load_nvml_once(void) {
    hami_iso_init(&g_vendor);
    dlsym_fn lookup = real_dlsym();
    const char *why;
    void *library = open_first(g_nvml_names, sizeof g_nvml_names / sizeof *g_nvml_names, "nvmlDeviceGetMemoryInfo",
                               lookup, &why);
    if (!library) {
        HAMI_LOG(HAMI_LOG_ERROR, "cannot load the management library %s (%s): its calls fail cleanly",
                 g_nvml_names[0], why);
        atomic_store_explicit(&hami_cu_nvml_state, -1, memory_order_release);
        return;
    }
#define HAMI_RESOLVE(name) hami_real.name = (__typeof__(hami_real.name))lookup(library, HAMI_STR(name));
    HAMI_NVML_HOOKS(HAMI_RESOLVE)
    HAMI_NVML_CALLS(HAMI_RESOLVE)
#undef HAMI_RESOLVE
    atomic_store_explicit(&hami_cu_nvml_state, 1, memory_order_release);
}
#else
static void load_nvml_once(void) { atomic_store_explicit(&hami_cu_nvml_state, -1, memory_order_release); }
#endif

int hami_cu_load_cuda(void) {
    pthread_once(&g_cuda_once, load_cuda_once);
    return atomic_load_explicit(&hami_cu_cuda_state, memory_order_acquire) > 0;
}

int hami_cu_load_nvml(void) {
    pthread_once(&g_nvml_once, load_nvml_once);
    return atomic_load_explicit(&hami_cu_nvml_state, memory_order_acquire) > 0;
}

/* ------------------------------------------------------------------------------------------------------ */
/* The ways in                                                                                              */
/* ------------------------------------------------------------------------------------------------------ */

HAMI_EXPORT CUresult HAMI_CU(GetProcAddress)(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    HAMI_CUDA_ENTER(HAMI_CU(GetProcAddress));
    CUresult r = hami_real.HAMI_CU(GetProcAddress)(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn) *pfn = hook_for_proc(symbol, *pfn, cudaVersion, flags);
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(GetProcAddress_v2)(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *symbolStatus) {
    HAMI_CUDA_ENTER(HAMI_CU(GetProcAddress_v2));
    CUresult r = hami_real.HAMI_CU(GetProcAddress_v2)(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn) *pfn = hook_for_proc(symbol, *pfn, cudaVersion, flags);
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(Init)(unsigned int flags) {
    HAMI_CUDA_ENTER(HAMI_CU(Init));
    CUresult r = hami_real.HAMI_CU(Init)(flags);
    int count = 0;
    if (r == CUDA_SUCCESS && hami_real.HAMI_CU(DeviceGetCount) && hami_real.HAMI_CU(DeviceGetCount)(&count) == CUDA_SUCCESS)
        hami_iso_set_device_count(count);
    return r;
}

/* ------------------------------------------------------------------------------------------------------ */
/* Contexts                                                                                                 */
/* ------------------------------------------------------------------------------------------------------ */

int hami_cu_refresh_device(void) {
    struct hami_cu_thread *t = &hami_cu_tls;
    CUcontext context = NULL;
    CUdevice device = 0;
    if (hami_real.HAMI_CU(CtxGetCurrent) && hami_real.HAMI_CU(CtxGetDevice) && hami_real.HAMI_CU(CtxGetCurrent)(&context) == CUDA_SUCCESS &&
        context && hami_real.HAMI_CU(CtxGetDevice)(&device) == CUDA_SUCCESS) {
        t->context = context;
        t->device = device;
        t->valid = 1;
        return device;
    }
    return 0; /* no current context: the driver refuses the call anyway */
}

/* The driver reserves memory for each process's context on a device; the grant's `context` figure of it is
 * counted against the container's limit before the process's first context there is created (primary or not),
 * and a context that would not fit is refused with CUDA_ERROR_OUT_OF_MEMORY, as the driver refuses one it has
 * no memory for. */

#define MAX_PRIMARY 64
static _Atomic(CUcontext) g_primary[MAX_PRIMARY];

#define CONTEXT_KINDS ((1u << HAMI_ISO_POINTER) | (1u << HAMI_ISO_ARRAY) | (1u << HAMI_ISO_MIPMAP))

HAMI_EXPORT CUresult HAMI_CU(CtxCreate_v2)(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    HAMI_CUDA_ENTER(HAMI_CU(CtxCreate_v2));
    int context = hami_iso_context_reserve(dev);
    if (context < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = hami_real.HAMI_CU(CtxCreate_v2)(pctx, flags, dev);
    if (r != CUDA_SUCCESS) hami_iso_context_unreserve(dev, context);
    hami_cu_context_changed();
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(CtxCreate_v3)(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                    unsigned int flags, CUdevice dev) {
    HAMI_CUDA_ENTER(HAMI_CU(CtxCreate_v3));
    int context = hami_iso_context_reserve(dev);
    if (context < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = hami_real.HAMI_CU(CtxCreate_v3)(pctx, paramsArray, numParams, flags, dev);
    if (r != CUDA_SUCCESS) hami_iso_context_unreserve(dev, context);
    hami_cu_context_changed();
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(CtxCreate_v4)(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                    CUdevice dev) {
    HAMI_CUDA_ENTER(HAMI_CU(CtxCreate_v4));
    int context = hami_iso_context_reserve(dev);
    if (context < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = hami_real.HAMI_CU(CtxCreate_v4)(pctx, ctxCreateParams, flags, dev);
    if (r != CUDA_SUCCESS) hami_iso_context_unreserve(dev, context);
    hami_cu_context_changed();
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(CtxDestroy_v2)(CUcontext ctx) {
    HAMI_CUDA_ENTER(HAMI_CU(CtxDestroy_v2));
    CUresult r = hami_real.HAMI_CU(CtxDestroy_v2)(ctx);
    hami_cu_context_changed();
    if (r == CUDA_SUCCESS && ctx) hami_iso_untrack_owner((uint64_t)(uintptr_t)ctx, CONTEXT_KINDS);
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(CtxSetCurrent)(CUcontext ctx) {
    HAMI_CUDA_ENTER(HAMI_CU(CtxSetCurrent));
    CUresult r = hami_real.HAMI_CU(CtxSetCurrent)(ctx);
    hami_cu_context_changed();
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(CtxPushCurrent_v2)(CUcontext ctx) {
    HAMI_CUDA_ENTER(HAMI_CU(CtxPushCurrent_v2));
    CUresult r = hami_real.HAMI_CU(CtxPushCurrent_v2)(ctx);
    hami_cu_context_changed();
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(CtxPopCurrent_v2)(CUcontext *pctx) {
    HAMI_CUDA_ENTER(HAMI_CU(CtxPopCurrent_v2));
    CUresult r = hami_real.HAMI_CU(CtxPopCurrent_v2)(pctx);
    hami_cu_context_changed();
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(DevicePrimaryCtxRetain)(CUcontext *pctx, CUdevice dev) {
    HAMI_CUDA_ENTER(HAMI_CU(DevicePrimaryCtxRetain));
    int context = hami_iso_context_reserve(dev);
    if (context < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = hami_real.HAMI_CU(DevicePrimaryCtxRetain)(pctx, dev);
    if (r != CUDA_SUCCESS) hami_iso_context_unreserve(dev, context);
    if (r == CUDA_SUCCESS && pctx && dev >= 0 && dev < MAX_PRIMARY)
        atomic_store_explicit(&g_primary[dev], *pctx, memory_order_relaxed);
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(DevicePrimaryCtxReset_v2)(CUdevice dev) {
    HAMI_CUDA_ENTER(HAMI_CU(DevicePrimaryCtxReset_v2));
    CUresult r = hami_real.HAMI_CU(DevicePrimaryCtxReset_v2)(dev);
    hami_cu_context_changed();
    if (r == CUDA_SUCCESS && dev >= 0 && dev < MAX_PRIMARY) {
        CUcontext primary = atomic_load_explicit(&g_primary[dev], memory_order_relaxed);
        if (primary) hami_iso_untrack_owner((uint64_t)(uintptr_t)primary, CONTEXT_KINDS);
    }
    return r;
}
