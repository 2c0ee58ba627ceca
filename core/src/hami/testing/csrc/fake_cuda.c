/*
 * fake_cuda.c: a fake CUDA-compatible driver, built by a vendor's isolation tests as its libcuda.so.1 (or its
 * driver's file name) and loaded behind the vendor's isolation library exactly as the real one would be; the
 * names may carry another prefix (FAKE_CU_PREFIX) and the API stop at an older version (FAKE_CUDA_VERSION). It stands in for the hardware (hami.testing's fake_device.c, configured by the
 * FAKE_CUDA_ variables), so that what the isolation library claims can be checked against what "really" happened:
 *   - devices: FAKE_CUDA_DEVICES (default 1), each of FAKE_CUDA_MEMORY bytes (k/m/g suffix; default 16g);
 *   - allocations are backed by host memory (FAKE_CUDA_NO_BACKING=1 keeps only a small header, for the
 *     benchmark) and counted per device in the shared state file FAKE_CUDA_STATE: what is really allocated now,
 *     and its peak, across every process of the test;
 *   - a kernel "runs" for FAKE_CUDA_KERNEL_NS plus FAKE_CUDA_KERNEL_NS_PER_BLOCK x blocks (a graph for
 *     FAKE_CUDA_GRAPH_NS, default the kernel time) on a per-device timeline shared by all processes (the
 *     device runs one thing at a time, in the order it was queued), credited to FAKE_CUDA_TAG (0-7) of the
 *     launching process; a launch waits, before it is queued, while the process has more than
 *     FAKE_CUDA_QUEUE_NS (default 20 ms) of its own work queued (a context's command buffer: other processes'
 *     work does not count);
 *   - each process's first context on a device reserves FAKE_CUDA_CONTEXT_MIB MiB of it (default 0) until the
 *     process ends, seen as used by cuMemGetInfo (and the fake NVML) like any allocation;
 *   - events are timestamps on that timeline (FAKE_CUDA_EVENT_TIMING=queued: on this process's own queue, so
 *     a launch's events also time the other processes' work queued before it: fake_device.h); synchronization
 *     sleeps until the process's work is done;
 *   - cuLaunchKernelEx keeps the config it was last handed, its address and a copy of it (the exported
 *     fake_cuda_launch_config_at and fake_cuda_launch_config), for a test to compare with the caller's;
 *   - cuGetProcAddress answers by name, CUDA version and per-thread-stream flag like the real driver, with the
 *     exported functions, or with internal addresses when FAKE_CUDA_PRIVATE_PROCS=1 (as a driver may).
 * On a normal exit it frees what the process still holds (the real driver frees a dead process's memory).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fake_device.h"

#define EXPORT __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))

/* The driver's names: FAKE_CU(MemAlloc_v2) is cuMemAlloc_v2, or <FAKE_CU_PREFIX>MemAlloc_v2 for a driver with
 * CUDA's API under another prefix (-DFAKE_CU_PREFIX=mu). */
#ifndef FAKE_CU_PREFIX
#define FAKE_CU_PREFIX cu
#endif
#define FAKE_PASTE(a, b) FAKE_PASTE_(a, b)
#define FAKE_PASTE_(a, b) a##b
#define FAKE_CU(suffix) FAKE_PASTE(FAKE_CU_PREFIX, suffix)
#define FAKE_STR(x) FAKE_STR_(x)
#define FAKE_STR_(x) #x

/* The driver API version the fake implements (-DFAKE_CUDA_VERSION=10020 for a CUDA 10.2-level driver): what came
 * later is not exported, cuGetProcAddress included, and cuDriverGetVersion reports it. */
#ifndef FAKE_CUDA_VERSION
#define FAKE_CUDA_VERSION 12080
#endif
#define SINCE_0 EXPORT
#if FAKE_CUDA_VERSION >= 11000
#define SINCE_11000 EXPORT
#else
#define SINCE_11000 HIDDEN
#endif
#if FAKE_CUDA_VERSION >= 11020
#define SINCE_11020 EXPORT
#else
#define SINCE_11020 HIDDEN
#endif
#if FAKE_CUDA_VERSION >= 11030
#define SINCE_11030 EXPORT
#else
#define SINCE_11030 HIDDEN
#endif
#if FAKE_CUDA_VERSION >= 11040
#define SINCE_11040 EXPORT
#else
#define SINCE_11040 HIDDEN
#endif
#if FAKE_CUDA_VERSION >= 11060
#define SINCE_11060 EXPORT
#else
#define SINCE_11060 HIDDEN
#endif
#if FAKE_CUDA_VERSION >= 12000
#define SINCE_12000 EXPORT
#else
#define SINCE_12000 HIDDEN
#endif
#if FAKE_CUDA_VERSION >= 12050
#define SINCE_12050 EXPORT
#else
#define SINCE_12050 HIDDEN
#endif

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long u64;

enum {
    SUCCESS = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_INITIALIZED = 3,
    INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201,
    INVALID_HANDLE = 400,
    NOT_FOUND = 500,
    NOT_READY = 600,
};

struct ctx {
    int device;
};
struct stream {
    int device;
};
struct event {
    u64 t;
    int recorded;
};
struct pool {
    int device;
};
struct location {
    int type;
    int id;
};
struct alloc_prop {
    int type;
    int handle_types;
    struct location location;
};
struct pool_props {
    int alloc_type;
    int handle_types;
    struct location location;
};
struct array_desc {
    size_t width, height;
    int format;
    unsigned channels;
};
struct array3d_desc {
    size_t width, height, depth;
    int format;
    unsigned channels;
    unsigned flags;
};
struct launch_config {
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_mem;
    void *stream;
    void *attrs;
    unsigned num_attrs;
};

/* ---- configuration and state ---------------------------------------------------------------------------- */

static u64 g_graph_ns;
static int g_private_procs;
static struct ctx g_primary[FAKE_MAX_DEVICES];

static __thread struct ctx *t_current;
static __thread struct ctx *t_stack[16];
static __thread int t_depth;

__attribute__((constructor)) static void fake_load(void) {
    fake_device_load("FAKE_CUDA_", 16ull << 30);
    g_graph_ns = fake_env("GRAPH_NS", fake_kernel_ns(0));
    g_private_procs = (int)fake_env("PRIVATE_PROCS", 0);
    for (int i = 0; i < FAKE_MAX_DEVICES; i++) g_primary[i].device = i;
}

static CUresult free_block(void *p) { return fake_free(p) ? SUCCESS : INVALID_VALUE; }

static int current_device(void) { return t_current ? t_current->device : -1; }

static u64 element_bytes(int format, unsigned channels) {
    u64 e;
    switch (format) {
    case 0x01: case 0x08: e = 1; break;
    case 0x02: case 0x09: case 0x10: e = 2; break;
    case 0x03: case 0x0a: case 0x20: e = 4; break;
    default: return 0;
    }
    return e * (channels ? channels : 1);
}

static u64 array_size(size_t w0, size_t h0, size_t d0, int format, unsigned channels, unsigned flags, unsigned levels) {
    u64 e = element_bytes(format, channels), total = 0;
    int layered = (flags & 0x05) != 0;
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        u64 w = w0 >> l, h = h0 >> l, d = layered ? d0 : d0 >> l;
        total += (w ? w : 1) * (h ? h : 1) * (d ? d : 1) * e;
        if ((w0 >> l) <= 1 && (h0 >> l) <= 1 && (layered || (d0 >> l) <= 1)) break;
    }
    return total;
}

/* ---- the API: every function has an exported name and an internal address ------------------------------- */

#define API_SINCE(since, name, params, args)                                                                    \
    static CUresult impl_##name params;                                                                        \
    SINCE_##since CUresult FAKE_CU(name) params { return impl_##name args; }                                   \
    static CUresult impl_##name params
#define API(name, params, args) API_SINCE(0, name, params, args)

API(Init, (unsigned flags), (flags)) {
    (void)flags;
    return SUCCESS;
}

API(DriverGetVersion, (int *v), (v)) {
    if (!v) return INVALID_VALUE;
    *v = FAKE_CUDA_VERSION;
    return SUCCESS;
}

API(DeviceGetCount, (int *n), (n)) {
    if (!n) return INVALID_VALUE;
    *n = fake.devices;
    return SUCCESS;
}

API(DeviceGet, (CUdevice *d, int ordinal), (d, ordinal)) {
    if (!d || ordinal < 0 || ordinal >= fake.devices) return INVALID_DEVICE;
    *d = ordinal;
    return SUCCESS;
}

API(DeviceTotalMem_v2, (size_t *bytes, CUdevice dev), (bytes, dev)) {
    if (!bytes) return INVALID_VALUE;
    if (dev < 0 || dev >= fake.devices) return INVALID_DEVICE;
    *bytes = fake.memory;
    return SUCCESS;
}

API(DevicePrimaryCtxRetain, (struct ctx **pctx, CUdevice dev), (pctx, dev)) {
    if (!pctx) return INVALID_VALUE;
    if (dev < 0 || dev >= fake.devices) return INVALID_DEVICE;
    if (!fake_context_up(dev)) return OUT_OF_MEMORY;
    *pctx = &g_primary[dev];
    return SUCCESS;
}

API_SINCE(11000, DevicePrimaryCtxRelease_v2, (CUdevice dev), (dev)) { return dev >= 0 && dev < fake.devices ? SUCCESS : INVALID_DEVICE; }

API_SINCE(11000, DevicePrimaryCtxReset_v2, (CUdevice dev), (dev)) {
    if (dev < 0 || dev >= fake.devices) return INVALID_DEVICE;
    fake_reset_device(dev); /* like the driver: everything of the context is gone */
    return SUCCESS;
}

API(CtxCreate_v2, (struct ctx **pctx, unsigned flags, CUdevice dev), (pctx, flags, dev)) {
    (void)flags;
    if (!pctx) return INVALID_VALUE;
    if (dev < 0 || dev >= fake.devices) return INVALID_DEVICE;
    if (!fake_context_up(dev)) return OUT_OF_MEMORY;
    struct ctx *c = malloc(sizeof *c);
    c->device = dev;
    *pctx = t_current = c;
    return SUCCESS;
}

API_SINCE(11040, CtxCreate_v3, (struct ctx **pctx, void *params, int n, unsigned flags, CUdevice dev), (pctx, params, n, flags, dev)) {
    (void)params;
    (void)n;
    return impl_CtxCreate_v2(pctx, flags, dev);
}

API_SINCE(12050, CtxCreate_v4, (struct ctx **pctx, void *params, unsigned flags, CUdevice dev), (pctx, params, flags, dev)) {
    (void)params;
    return impl_CtxCreate_v2(pctx, flags, dev);
}

API(CtxDestroy_v2, (struct ctx *c), (c)) {
    if (!c) return INVALID_VALUE;
    if (t_current == c) t_current = NULL;
    if (c < g_primary || c >= g_primary + FAKE_MAX_DEVICES) free(c);
    return SUCCESS;
}

API(CtxSetCurrent, (struct ctx *c), (c)) {
    t_current = c;
    return SUCCESS;
}

API(CtxGetCurrent, (struct ctx **pc), (pc)) {
    if (!pc) return INVALID_VALUE;
    *pc = t_current;
    return SUCCESS;
}

API(CtxPushCurrent_v2, (struct ctx *c), (c)) {
    if (t_depth >= 16) return INVALID_VALUE;
    t_stack[t_depth++] = t_current;
    t_current = c;
    return SUCCESS;
}

API(CtxPopCurrent_v2, (struct ctx **pc), (pc)) {
    if (!t_depth) return INVALID_CONTEXT;
    if (pc) *pc = t_current;
    t_current = t_stack[--t_depth];
    return SUCCESS;
}

API(CtxGetDevice, (CUdevice *d), (d)) {
    if (!d) return INVALID_VALUE;
    if (!t_current) return INVALID_CONTEXT;
    *d = t_current->device;
    return SUCCESS;
}

API(CtxSynchronize, (void), ()) {
    fake_synchronize();
    return SUCCESS;
}

API(MemGetInfo_v2, (size_t *free, size_t *total), (free, total)) {
    int dev = current_device();
    if (dev < 0) return INVALID_CONTEXT;
    if (!free || !total) return INVALID_VALUE;
    u64 used = fake_used(dev);
    *total = fake.memory;
    *free = used > fake.memory ? 0 : fake.memory - used;
    return SUCCESS;
}

API(MemAlloc_v2, (CUdeviceptr *p, size_t size), (p, size)) {
    int dev = current_device();
    if (dev < 0) return INVALID_CONTEXT;
    if (!p || !size) return INVALID_VALUE;
    void *b = fake_alloc(dev, size, 1);
    if (!b) return OUT_OF_MEMORY;
    *p = (CUdeviceptr)(uintptr_t)b;
    return SUCCESS;
}

API(MemAllocPitch_v2, (CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned element),
    (p, pitch, width, height, element)) {
    (void)element;
    int dev = current_device();
    if (dev < 0) return INVALID_CONTEXT;
    if (!p || !pitch || !width || !height) return INVALID_VALUE;
    size_t row = (width + 255) / 256 * 256;
    void *b = fake_alloc(dev, (u64)row * height, 1);
    if (!b) return OUT_OF_MEMORY;
    *p = (CUdeviceptr)(uintptr_t)b;
    *pitch = row;
    return SUCCESS;
}

API(MemAllocManaged, (CUdeviceptr *p, size_t size, unsigned flags), (p, size, flags)) {
    (void)flags;
    return impl_MemAlloc_v2(p, size);
}

API(MemFree_v2, (CUdeviceptr p), (p)) { return free_block((void *)(uintptr_t)p); }

API(MemCreate, (u64 *handle, size_t size, const struct alloc_prop *prop, u64 flags), (handle, size, prop, flags)) {
    (void)flags;
    if (!handle || !prop || !size) return INVALID_VALUE;
    int device_memory = prop->location.type == 1;
    if (device_memory && (prop->location.id < 0 || prop->location.id >= fake.devices)) return INVALID_DEVICE;
    void *b = fake_alloc(device_memory ? prop->location.id : 0, size, device_memory);
    if (!b) return OUT_OF_MEMORY;
    *handle = (u64)(uintptr_t)b;
    return SUCCESS;
}

API(MemRelease, (u64 handle), (handle)) { return free_block((void *)(uintptr_t)handle); }

API_SINCE(11020, MemPoolCreate, (struct pool **pool, const struct pool_props *props), (pool, props)) {
    if (!pool || !props || props->location.type != 1) return INVALID_VALUE;
    if (props->location.id < 0 || props->location.id >= fake.devices) return INVALID_DEVICE;
    *pool = malloc(sizeof **pool);
    (*pool)->device = props->location.id;
    return SUCCESS;
}

API_SINCE(11020, MemPoolDestroy, (struct pool *pool), (pool)) {
    free(pool);
    return SUCCESS;
}

API_SINCE(11020, MemAllocAsync, (CUdeviceptr *p, size_t size, void *stream), (p, size, stream)) {
    (void)stream;
    return impl_MemAlloc_v2(p, size);
}

API_SINCE(11020, MemAllocAsync_ptsz, (CUdeviceptr *p, size_t size, void *stream), (p, size, stream)) {
    (void)stream;
    return impl_MemAlloc_v2(p, size);
}

static CUresult alloc_from_pool(CUdeviceptr *p, size_t size, struct pool *pool) {
    if (!p || !pool || !size) return INVALID_VALUE;
    void *b = fake_alloc(pool->device, size, 1);
    if (!b) return OUT_OF_MEMORY;
    *p = (CUdeviceptr)(uintptr_t)b;
    return SUCCESS;
}

API_SINCE(11020, MemAllocFromPoolAsync, (CUdeviceptr *p, size_t size, struct pool *pool, void *stream), (p, size, pool, stream)) {
    (void)stream;
    return alloc_from_pool(p, size, pool);
}

API_SINCE(11020, MemAllocFromPoolAsync_ptsz, (CUdeviceptr *p, size_t size, struct pool *pool, void *stream),
    (p, size, pool, stream)) {
    (void)stream;
    return alloc_from_pool(p, size, pool);
}

API_SINCE(11020, MemFreeAsync, (CUdeviceptr p, void *stream), (p, stream)) {
    (void)stream;
    return free_block((void *)(uintptr_t)p);
}

API_SINCE(11020, MemFreeAsync_ptsz, (CUdeviceptr p, void *stream), (p, stream)) {
    (void)stream;
    return free_block((void *)(uintptr_t)p);
}

static CUresult new_array(void **handle, u64 size) {
    int dev = current_device();
    if (dev < 0) return INVALID_CONTEXT;
    if (!handle || !size) return INVALID_VALUE;
    void *b = fake_alloc(dev, size, 1);
    if (!b) return OUT_OF_MEMORY;
    *handle = b;
    return SUCCESS;
}

API(ArrayCreate_v2, (void **handle, const struct array_desc *d), (handle, d)) {
    if (!d) return INVALID_VALUE;
    return new_array(handle, array_size(d->width, d->height, 0, d->format, d->channels, 0, 1));
}

API(Array3DCreate_v2, (void **handle, const struct array3d_desc *d), (handle, d)) {
    if (!d) return INVALID_VALUE;
    return new_array(handle, array_size(d->width, d->height, d->depth, d->format, d->channels, d->flags, 1));
}

API(ArrayDestroy, (void *handle), (handle)) { return free_block(handle); }

API(MipmappedArrayCreate, (void **handle, const struct array3d_desc *d, unsigned levels), (handle, d, levels)) {
    if (!d) return INVALID_VALUE;
    return new_array(handle, array_size(d->width, d->height, d->depth, d->format, d->channels, d->flags, levels));
}

API(MipmappedArrayDestroy, (void *handle), (handle)) { return free_block(handle); }

/* ---- streams, events, launches -------------------------------------------------------------------------- */

API(StreamCreate, (struct stream **s, unsigned flags), (s, flags)) {
    (void)flags;
    if (!s) return INVALID_VALUE;
    *s = malloc(sizeof **s);
    (*s)->device = current_device();
    return SUCCESS;
}

API(StreamDestroy_v2, (struct stream *s), (s)) {
    if ((uintptr_t)s > 2) free(s);
    return SUCCESS;
}

API(StreamSynchronize, (void *s), (s)) {
    (void)s;
    fake_synchronize();
    return SUCCESS;
}

API(StreamIsCapturing, (void *s, int *status), (s, status)) {
    (void)s;
    if (!status) return INVALID_VALUE;
    *status = 0;
    return SUCCESS;
}

API(StreamIsCapturing_ptsz, (void *s, int *status), (s, status)) { return impl_StreamIsCapturing(s, status); }

API(EventCreate, (struct event **e, unsigned flags), (e, flags)) {
    (void)flags;
    if (!e) return INVALID_VALUE;
    *e = calloc(1, sizeof **e);
    return SUCCESS;
}

API(EventDestroy_v2, (struct event *e), (e)) {
    free(e);
    return SUCCESS;
}

API(EventRecord, (struct event *e, void *stream), (e, stream)) {
    (void)stream;
    int dev = current_device();
    if (dev < 0) return INVALID_CONTEXT;
    if (!e) return INVALID_HANDLE;
    e->t = fake_reached(dev);
    e->recorded = 1;
    return SUCCESS;
}

API(EventRecord_ptsz, (struct event *e, void *stream), (e, stream)) { return impl_EventRecord(e, stream); }

API(EventQuery, (struct event *e), (e)) {
    if (!e) return INVALID_HANDLE;
    return fake_now_ns() >= e->t ? SUCCESS : NOT_READY;
}

API(EventSynchronize, (struct event *e), (e)) {
    if (!e) return INVALID_HANDLE;
    fake_sleep_until(e->t);
    return SUCCESS;
}

API(EventElapsedTime, (float *ms, struct event *a, struct event *b), (ms, a, b)) {
    if (!ms || !a || !b || !a->recorded || !b->recorded) return INVALID_HANDLE;
    if (fake_now_ns() < a->t || fake_now_ns() < b->t) return NOT_READY;
    *ms = (float)(((double)b->t - (double)a->t) / 1e6);
    return SUCCESS;
}

static CUresult run(u64 duration) {
    int dev = current_device();
    if (dev < 0) return INVALID_CONTEXT;
    fake_run(dev, duration);
    return SUCCESS;
}

static u64 kernel_time(u64 x, u64 y, u64 z) { return fake_kernel_ns(x * y * z); }

API(LaunchKernel, (void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                     unsigned shmem, void *stream, void **params, void **extra),
    (f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra)) {
    (void)bx, (void)by, (void)bz, (void)shmem, (void)stream, (void)params, (void)extra;
    if (!f) return INVALID_HANDLE;
    return run(kernel_time(gx, gy, gz));
}

API(LaunchKernel_ptsz, (void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shmem, void *stream, void **params, void **extra),
    (f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra)) {
    return impl_LaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}

API(LaunchCooperativeKernel, (void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                unsigned bz, unsigned shmem, void *stream, void **params),
    (f, gx, gy, gz, bx, by, bz, shmem, stream, params)) {
    return impl_LaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, NULL);
}

API(LaunchCooperativeKernel_ptsz, (void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                     unsigned bz, unsigned shmem, void *stream, void **params),
    (f, gx, gy, gz, bx, by, bz, shmem, stream, params)) {
    return impl_LaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, NULL);
}

/* The config the process's last cuLaunchKernelEx (or _ptsz) was handed, where it lay and what it said: a test
 * reads them by name (ctypes' in_dll) to tell whether the driver got the caller's own struct or a copy of it. */
EXPORT const void *fake_cuda_launch_config_at;
EXPORT struct launch_config fake_cuda_launch_config;

API_SINCE(11060, LaunchKernelEx, (const struct launch_config *c, void *f, void **params, void **extra), (c, f, params, extra)) {
    (void)params, (void)extra;
    if (!c || !f) return INVALID_VALUE;
    fake_cuda_launch_config_at = c;
    fake_cuda_launch_config = *c;
    return run(kernel_time(c->grid_x, c->grid_y, c->grid_z));
}

API_SINCE(11060, LaunchKernelEx_ptsz, (const struct launch_config *c, void *f, void **params, void **extra),
    (c, f, params, extra)) {
    return impl_LaunchKernelEx(c, f, params, extra);
}

API(GraphLaunch, (void *graph, void *stream), (graph, stream)) {
    (void)stream;
    if (!graph) return INVALID_HANDLE;
    return run(g_graph_ns);
}

API(GraphLaunch_ptsz, (void *graph, void *stream), (graph, stream)) { return impl_GraphLaunch(graph, stream); }

/* ---- cuGetProcAddress ------------------------------------------------------------------------------------ */

struct proc {
    const char *name;
    int version;
    int per_thread;
    void *exported;
    void *internal;
};

#define P(name, version, pt, symbol) {FAKE_STR(FAKE_CU(name)), version, pt, (void *)&FAKE_CU(symbol), (void *)impl_##symbol}

static CUresult impl_GetProcAddress_v2(const char *symbol, void **pfn, int version, u64 flags, int *status);
SINCE_12000 CUresult FAKE_CU(GetProcAddress_v2)(const char *symbol, void **pfn, int version, u64 flags, int *status);
static CUresult impl_GetProcAddress(const char *symbol, void **pfn, int version, u64 flags);
SINCE_11030 CUresult FAKE_CU(GetProcAddress)(const char *symbol, void **pfn, int version, u64 flags);

static const struct proc g_procs[] = {
    P(Init, 2000, 0, Init),
    P(DriverGetVersion, 2020, 0, DriverGetVersion),
    P(GetProcAddress, 11030, 0, GetProcAddress),
    P(GetProcAddress, 12000, 0, GetProcAddress_v2),
    P(DeviceGetCount, 2000, 0, DeviceGetCount),
    P(DeviceGet, 2000, 0, DeviceGet),
    P(DeviceTotalMem, 3020, 0, DeviceTotalMem_v2),
    P(DevicePrimaryCtxRetain, 7000, 0, DevicePrimaryCtxRetain),
    P(DevicePrimaryCtxRelease, 11000, 0, DevicePrimaryCtxRelease_v2),
    P(DevicePrimaryCtxReset, 11000, 0, DevicePrimaryCtxReset_v2),
    P(CtxCreate, 3020, 0, CtxCreate_v2),
    P(CtxCreate, 11040, 0, CtxCreate_v3),
    P(CtxCreate, 12050, 0, CtxCreate_v4),
    P(CtxDestroy, 4000, 0, CtxDestroy_v2),
    P(CtxSetCurrent, 4000, 0, CtxSetCurrent),
    P(CtxGetCurrent, 4000, 0, CtxGetCurrent),
    P(CtxPushCurrent, 4000, 0, CtxPushCurrent_v2),
    P(CtxPopCurrent, 4000, 0, CtxPopCurrent_v2),
    P(CtxGetDevice, 2000, 0, CtxGetDevice),
    P(CtxSynchronize, 2000, 0, CtxSynchronize),
    P(MemGetInfo, 3020, 0, MemGetInfo_v2),
    P(MemAlloc, 3020, 0, MemAlloc_v2),
    P(MemAllocPitch, 3020, 0, MemAllocPitch_v2),
    P(MemAllocManaged, 6000, 0, MemAllocManaged),
    P(MemFree, 3020, 0, MemFree_v2),
    P(MemCreate, 10020, 0, MemCreate),
    P(MemRelease, 10020, 0, MemRelease),
    P(MemPoolCreate, 11020, 0, MemPoolCreate),
    P(MemPoolDestroy, 11020, 0, MemPoolDestroy),
    P(MemAllocAsync, 11020, 0, MemAllocAsync),
    P(MemAllocAsync, 11020, 1, MemAllocAsync_ptsz),
    P(MemAllocFromPoolAsync, 11020, 0, MemAllocFromPoolAsync),
    P(MemAllocFromPoolAsync, 11020, 1, MemAllocFromPoolAsync_ptsz),
    P(MemFreeAsync, 11020, 0, MemFreeAsync),
    P(MemFreeAsync, 11020, 1, MemFreeAsync_ptsz),
    P(ArrayCreate, 3020, 0, ArrayCreate_v2),
    P(Array3DCreate, 3020, 0, Array3DCreate_v2),
    P(ArrayDestroy, 2000, 0, ArrayDestroy),
    P(MipmappedArrayCreate, 5000, 0, MipmappedArrayCreate),
    P(MipmappedArrayDestroy, 5000, 0, MipmappedArrayDestroy),
    P(StreamCreate, 2000, 0, StreamCreate),
    P(StreamDestroy, 4000, 0, StreamDestroy_v2),
    P(StreamSynchronize, 2000, 0, StreamSynchronize),
    P(StreamIsCapturing, 10000, 0, StreamIsCapturing),
    P(StreamIsCapturing, 10000, 1, StreamIsCapturing_ptsz),
    P(EventCreate, 2000, 0, EventCreate),
    P(EventDestroy, 4000, 0, EventDestroy_v2),
    P(EventRecord, 2000, 0, EventRecord),
    P(EventRecord, 7000, 1, EventRecord_ptsz),
    P(EventQuery, 2000, 0, EventQuery),
    P(EventSynchronize, 2000, 0, EventSynchronize),
    P(EventElapsedTime, 2000, 0, EventElapsedTime),
    P(LaunchKernel, 4000, 0, LaunchKernel),
    P(LaunchKernel, 7000, 1, LaunchKernel_ptsz),
    P(LaunchKernelEx, 11060, 0, LaunchKernelEx),
    P(LaunchKernelEx, 11060, 1, LaunchKernelEx_ptsz),
    P(LaunchCooperativeKernel, 9000, 0, LaunchCooperativeKernel),
    P(LaunchCooperativeKernel, 9000, 1, LaunchCooperativeKernel_ptsz),
    P(GraphLaunch, 10000, 0, GraphLaunch),
    P(GraphLaunch, 10000, 1, GraphLaunch_ptsz),
};

static CUresult impl_GetProcAddress_v2(const char *symbol, void **pfn, int version, u64 flags, int *status) {
    if (!symbol || !pfn) return INVALID_VALUE;
    int want = (flags & 2) ? 1 : 0, known = 0;
    const struct proc *best = NULL;
    for (int pass = want; pass >= 0 && !best; pass--)
        for (size_t i = 0; i < sizeof g_procs / sizeof *g_procs; i++) {
            const struct proc *p = &g_procs[i];
            if (strcmp(p->name, symbol)) continue;
            known = 1;
            if (p->per_thread != pass || p->version > version || p->version > FAKE_CUDA_VERSION) continue;
            if (!best || p->version > best->version) best = p;
        }
    *pfn = best ? (g_private_procs ? best->internal : best->exported) : NULL;
    if (status) *status = best ? 0 : known ? 2 : 1;
    return best ? SUCCESS : NOT_FOUND;
}

SINCE_12000 CUresult FAKE_CU(GetProcAddress_v2)(const char *symbol, void **pfn, int version, u64 flags, int *status) {
    return impl_GetProcAddress_v2(symbol, pfn, version, flags, status);
}

static CUresult impl_GetProcAddress(const char *symbol, void **pfn, int version, u64 flags) {
    return impl_GetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

SINCE_11030 CUresult FAKE_CU(GetProcAddress)(const char *symbol, void **pfn, int version, u64 flags) {
    return impl_GetProcAddress(symbol, pfn, version, flags);
}
