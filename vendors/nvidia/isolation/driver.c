/*
 * driver.c: how calls reach libvgpu.so, and how libvgpu.so reaches the real driver.
 *
 * Three ways in, all covered: the exported wrappers (a program linked against libcuda.so.1 binds to ours
 * first, since we are preloaded), dlsym (overridden: a lookup of a hooked name, or of dlsym, dlvsym, dlopen or
 * dlmopen, in any library that has it answers our hook; the core's lookup.c covers dlvsym, RTLD_DEEPBIND and
 * dlmopen; everything else, RTLD_NEXT included, is passed to the real dlsym by a tail call so that
 * the caller's identity is preserved), and cuGetProcAddress / cuGetProcAddress_v2 (the real driver answers for
 * the requested version and stream flags; its answer is swapped for the hook of the same function, matched by
 * address, or by name and version when the driver hands out internal addresses).
 *
 * The real libcuda.so.1 and libnvidia-ml.so.1 are opened on the first hooked call, never at load time. When one
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

#include "vgpu.h"

struct hami_nv_real hami_real;
_Atomic int hami_nv_cuda_state;
_Atomic int hami_nv_nvml_state;
_Thread_local struct hami_nv_thread hami_nv_tls __attribute__((tls_model("initial-exec")));

static const hami_iso_vendor g_vendor = {
    .name = "nvidia",
    .memory_limit_env = "CUDA_DEVICE_MEMORY_LIMIT",
    .core_limit_env = "CUDA_DEVICE_SM_LIMIT",
    .shared_cache_env = "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    .default_cache_path = "/tmp/cudevshr.cache",
    .oversubscribe_env = "CUDA_OVERSUBSCRIBE",
    .priority_env = "CUDA_TASK_PRIORITY",
    .policy_env = "GPU_CORE_UTILIZATION_POLICY",
    .log_level_env = "LIBCUDA_LOG_LEVEL",
    .visible_devices_env = "NVIDIA_VISIBLE_DEVICES",
    .stream_capturing = hami_nv_stream_capturing,
};

/* ------------------------------------------------------------------------------------------------------ */
/* The real dlsym                                                                                           */
/* ------------------------------------------------------------------------------------------------------ */

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn g_real_dlsym;

static dlsym_fn find_real_dlsym(void) {
    dlsym_fn found = (dlsym_fn)hami_iso_libc_symbol("dlsym"); /* not dlvsym: the core's answers our dlsym */
    if (found) __atomic_store_n(&g_real_dlsym, found, __ATOMIC_RELEASE);
    return found;
}

static inline dlsym_fn real_dlsym(void) {
    dlsym_fn f = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
    return HAMI_LIKELY(f != NULL) ? f : find_real_dlsym();
}

/* ------------------------------------------------------------------------------------------------------ */
/* Hook tables                                                                                              */
/* ------------------------------------------------------------------------------------------------------ */

struct hook {
    const char *name;
    void *hook;
};

static const struct hook g_hooks[] = {
#define HAMI_ENTRY(name) {#name, (void *)&name},
    HAMI_CUDA_HOOKS(HAMI_ENTRY) HAMI_NVML_HOOKS(HAMI_ENTRY)
#undef HAMI_ENTRY
};
#define HOOK_COUNT (sizeof g_hooks / sizeof *g_hooks)

static void *hook_by_name(const char *name) {
    if (!name || !((name[0] == 'c' && name[1] == 'u') || !strncmp(name, "nvml", 4))) return NULL;
    for (size_t i = 0; i < HOOK_COUNT; i++)
        if (!strcmp(g_hooks[i].name, name)) return g_hooks[i].hook;
    return NULL;
}

/* The core's dlvsym (lookup.c) answers these hooks too, and so does our dlsym for dlsym itself. */
void *hami_iso_hook_for_symbol(const char *name) {
    if (name && !strcmp(name, "dlsym")) return (void *)&dlsym;
    return hook_by_name(name);
}

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
    {"cuInit", 2000, 0, "cuInit"},
    {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
    {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
    {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"},
    {"cuMemAllocPitch", 3020, 0, "cuMemAllocPitch_v2"},
    {"cuMemAllocManaged", 6000, 0, "cuMemAllocManaged"},
    {"cuMemFree", 3020, 0, "cuMemFree_v2"},
    {"cuMemCreate", 10020, 0, "cuMemCreate"},
    {"cuMemRelease", 10020, 0, "cuMemRelease"},
    {"cuMemAllocAsync", 11020, 0, "cuMemAllocAsync"},
    {"cuMemAllocAsync", 11020, 1, "cuMemAllocAsync_ptsz"},
    {"cuMemFreeAsync", 11020, 0, "cuMemFreeAsync"},
    {"cuMemFreeAsync", 11020, 1, "cuMemFreeAsync_ptsz"},
    {"cuMemAllocFromPoolAsync", 11020, 0, "cuMemAllocFromPoolAsync"},
    {"cuMemAllocFromPoolAsync", 11020, 1, "cuMemAllocFromPoolAsync_ptsz"},
    {"cuMemPoolCreate", 11020, 0, "cuMemPoolCreate"},
    {"cuMemPoolDestroy", 11020, 0, "cuMemPoolDestroy"},
    {"cuArrayCreate", 3020, 0, "cuArrayCreate_v2"},
    {"cuArray3DCreate", 3020, 0, "cuArray3DCreate_v2"},
    {"cuArrayDestroy", 2000, 0, "cuArrayDestroy"},
    {"cuMipmappedArrayCreate", 5000, 0, "cuMipmappedArrayCreate"},
    {"cuMipmappedArrayDestroy", 5000, 0, "cuMipmappedArrayDestroy"},
    {"cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2"},
    {"cuDeviceTotalMem", 3020, 0, "cuDeviceTotalMem_v2"},
    {"cuLaunchKernel", 4000, 0, "cuLaunchKernel"},
    {"cuLaunchKernel", 7000, 1, "cuLaunchKernel_ptsz"},
    {"cuLaunchKernelEx", 11060, 0, "cuLaunchKernelEx"},
    {"cuLaunchKernelEx", 11060, 1, "cuLaunchKernelEx_ptsz"},
    {"cuLaunchCooperativeKernel", 9000, 0, "cuLaunchCooperativeKernel"},
    {"cuLaunchCooperativeKernel", 9000, 1, "cuLaunchCooperativeKernel_ptsz"},
    {"cuGraphLaunch", 10000, 0, "cuGraphLaunch"},
    {"cuGraphLaunch", 10000, 1, "cuGraphLaunch_ptsz"},
    {"cuCtxCreate", 3020, 0, "cuCtxCreate_v2"},
    {"cuCtxCreate", 11040, 0, "cuCtxCreate_v3"},
    {"cuCtxCreate", 12050, 0, "cuCtxCreate_v4"},
    {"cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2"},
    {"cuCtxSetCurrent", 4000, 0, "cuCtxSetCurrent"},
    {"cuCtxPushCurrent", 4000, 0, "cuCtxPushCurrent_v2"},
    {"cuCtxPopCurrent", 4000, 0, "cuCtxPopCurrent_v2"},
    {"cuDevicePrimaryCtxRetain", 7000, 0, "cuDevicePrimaryCtxRetain"},
    {"cuDevicePrimaryCtxReset", 11000, 0, "cuDevicePrimaryCtxReset_v2"},
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

static void load_cuda_once(void) {
    hami_iso_init(&g_vendor);
    dlsym_fn lookup = real_dlsym();
    void *library = lookup ? dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!library) {
        HAMI_LOG(HAMI_LOG_ERROR, "cannot load the CUDA driver libcuda.so.1 (%s): CUDA calls fail cleanly",
                 lookup ? dlerror() : "no dlsym");
        atomic_store_explicit(&hami_nv_cuda_state, -1, memory_order_release);
        return;
    }
#define HAMI_RESOLVE(name) hami_real.name = (__typeof__(hami_real.name))lookup(library, #name);
    HAMI_CUDA_HOOKS(HAMI_RESOLVE)
    HAMI_CUDA_CALLS(HAMI_RESOLVE)
#undef HAMI_RESOLVE
    size_t i = 0;
#define HAMI_PAIR(name) g_real_of_hook[i++] = (void *)hami_real.name;
    HAMI_CUDA_HOOKS(HAMI_PAIR)
#undef HAMI_PAIR
    atomic_store_explicit(&hami_nv_cuda_state, 1, memory_order_release);
}

static void load_nvml_once(void) {
    hami_iso_init(&g_vendor);
    dlsym_fn lookup = real_dlsym();
    void *library = lookup ? dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!library) {
        HAMI_LOG(HAMI_LOG_ERROR, "cannot load NVML libnvidia-ml.so.1 (%s): NVML calls fail cleanly",
                 lookup ? dlerror() : "no dlsym");
        atomic_store_explicit(&hami_nv_nvml_state, -1, memory_order_release);
        return;
    }
#define HAMI_RESOLVE(name) hami_real.name = (__typeof__(hami_real.name))lookup(library, #name);
    HAMI_NVML_HOOKS(HAMI_RESOLVE)
    HAMI_NVML_CALLS(HAMI_RESOLVE)
#undef HAMI_RESOLVE
    atomic_store_explicit(&hami_nv_nvml_state, 1, memory_order_release);
}

int hami_nv_load_cuda(void) {
    pthread_once(&g_cuda_once, load_cuda_once);
    return atomic_load_explicit(&hami_nv_cuda_state, memory_order_acquire) > 0;
}

int hami_nv_load_nvml(void) {
    pthread_once(&g_nvml_once, load_nvml_once);
    return atomic_load_explicit(&hami_nv_nvml_state, memory_order_acquire) > 0;
}

/* ------------------------------------------------------------------------------------------------------ */
/* The ways in                                                                                              */
/* ------------------------------------------------------------------------------------------------------ */

HAMI_EXPORT void *dlsym(void *handle, const char *symbol) {
    dlsym_fn lookup = real_dlsym();
    if (HAMI_UNLIKELY(!lookup)) return NULL;
    void *hook = hami_iso_lookup_hook(symbol);
    if (hook) return lookup(handle, symbol) ? hook : NULL;
    return lookup(handle, symbol); /* a tail call: RTLD_NEXT still means "after the caller" */
}

HAMI_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    HAMI_CUDA_ENTER(cuGetProcAddress);
    CUresult r = hami_real.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn) *pfn = hook_for_proc(symbol, *pfn, cudaVersion, flags);
    return r;
}

HAMI_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *symbolStatus) {
    HAMI_CUDA_ENTER(cuGetProcAddress_v2);
    CUresult r = hami_real.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn) *pfn = hook_for_proc(symbol, *pfn, cudaVersion, flags);
    return r;
}

HAMI_EXPORT CUresult cuInit(unsigned int flags) {
    HAMI_CUDA_ENTER(cuInit);
    CUresult r = hami_real.cuInit(flags);
    int count = 0;
    if (r == CUDA_SUCCESS && hami_real.cuDeviceGetCount && hami_real.cuDeviceGetCount(&count) == CUDA_SUCCESS)
        hami_iso_set_device_count(count);
    return r;
}

/* ------------------------------------------------------------------------------------------------------ */
/* Contexts                                                                                                 */
/* ------------------------------------------------------------------------------------------------------ */

int hami_nv_refresh_device(void) {
    struct hami_nv_thread *t = &hami_nv_tls;
    CUcontext context = NULL;
    CUdevice device = 0;
    if (hami_real.cuCtxGetCurrent && hami_real.cuCtxGetDevice && hami_real.cuCtxGetCurrent(&context) == CUDA_SUCCESS &&
        context && hami_real.cuCtxGetDevice(&device) == CUDA_SUCCESS) {
        t->context = context;
        t->device = device;
        t->valid = 1;
        return device;
    }
    return 0; /* no current context: the driver refuses the call anyway */
}

#define MAX_PRIMARY 64
static _Atomic(CUcontext) g_primary[MAX_PRIMARY];

#define CONTEXT_KINDS ((1u << HAMI_ISO_POINTER) | (1u << HAMI_ISO_ARRAY) | (1u << HAMI_ISO_MIPMAP))

HAMI_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    HAMI_CUDA_ENTER(cuCtxCreate_v2);
    CUresult r = hami_real.cuCtxCreate_v2(pctx, flags, dev);
    hami_nv_context_changed();
    return r;
}

HAMI_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                    unsigned int flags, CUdevice dev) {
    HAMI_CUDA_ENTER(cuCtxCreate_v3);
    CUresult r = hami_real.cuCtxCreate_v3(pctx, paramsArray, numParams, flags, dev);
    hami_nv_context_changed();
    return r;
}

HAMI_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                    CUdevice dev) {
    HAMI_CUDA_ENTER(cuCtxCreate_v4);
    CUresult r = hami_real.cuCtxCreate_v4(pctx, ctxCreateParams, flags, dev);
    hami_nv_context_changed();
    return r;
}

HAMI_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    HAMI_CUDA_ENTER(cuCtxDestroy_v2);
    CUresult r = hami_real.cuCtxDestroy_v2(ctx);
    hami_nv_context_changed();
    if (r == CUDA_SUCCESS && ctx) hami_iso_untrack_owner((uint64_t)(uintptr_t)ctx, CONTEXT_KINDS);
    return r;
}

HAMI_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    HAMI_CUDA_ENTER(cuCtxSetCurrent);
    CUresult r = hami_real.cuCtxSetCurrent(ctx);
    hami_nv_context_changed();
    return r;
}

HAMI_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    HAMI_CUDA_ENTER(cuCtxPushCurrent_v2);
    CUresult r = hami_real.cuCtxPushCurrent_v2(ctx);
    hami_nv_context_changed();
    return r;
}

HAMI_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    HAMI_CUDA_ENTER(cuCtxPopCurrent_v2);
    CUresult r = hami_real.cuCtxPopCurrent_v2(pctx);
    hami_nv_context_changed();
    return r;
}

HAMI_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    HAMI_CUDA_ENTER(cuDevicePrimaryCtxRetain);
    CUresult r = hami_real.cuDevicePrimaryCtxRetain(pctx, dev);
    if (r == CUDA_SUCCESS && pctx && dev >= 0 && dev < MAX_PRIMARY)
        atomic_store_explicit(&g_primary[dev], *pctx, memory_order_relaxed);
    return r;
}

HAMI_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    HAMI_CUDA_ENTER(cuDevicePrimaryCtxReset_v2);
    CUresult r = hami_real.cuDevicePrimaryCtxReset_v2(dev);
    hami_nv_context_changed();
    if (r == CUDA_SUCCESS && dev >= 0 && dev < MAX_PRIMARY) {
        CUcontext primary = atomic_load_explicit(&g_primary[dev], memory_order_relaxed);
        if (primary) hami_iso_untrack_owner((uint64_t)(uintptr_t)primary, CONTEXT_KINDS);
    }
    return r;
}
