/*
 * fake_cuda.c: a fake CUDA driver, built by the tests as libcuda.so.1 and loaded behind libvgpu.so exactly as
 * the real one would be. It stands in for the hardware (hami.testing's fake_device.c, configured by the
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
 *   - events are timestamps on that timeline; synchronization sleeps until the process's work is done;
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

#define API(name, params, args)                                                                                \
    static CUresult impl_##name params;                                                                        \
    EXPORT CUresult name params { return impl_##name args; }                                                   \
    static CUresult impl_##name params

API(cuInit, (unsigned flags), (flags)) {
    (void)flags;
    return SUCCESS;
}

API(cuDriverGetVersion, (int *v), (v)) {
    if (!v) return INVALID_VALUE;
    *v = 12080;
    return SUCCESS;
}

API(cuDeviceGetCount, (int *n), (n)) {
    if (!n) return INVALID_VALUE;
    *n = fake.devices;
    return SUCCESS;
}

API(cuDeviceGet, (CUdevice *d, int ordinal), (d, ordinal)) {
    if (!d || ordinal < 0 || ordinal >= fake.devices) return INVALID_DEVICE;
    *d = ordinal;
    return SUCCESS;
}

API(cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev), (bytes, dev)) {
    if (!bytes) return INVALID_VALUE;
    if (dev < 0 || dev >= fake.devices) return INVALID_DEVICE;
    *bytes = fake.memory;
    return SUCCESS;
}

API(cuDevicePrimaryCtxRetain, (struct ctx **pctx, CUdevice dev), (pctx, dev)) {
    if (!pctx) return INVALID_VALUE;
    if (dev < 0 || dev >= fake.devices) return INVALID_DEVICE;
    *pctx = &g_primary[dev];
    return SUCCESS;
}

API(cuDevicePrimaryCtxRelease_v2, (CUdevice dev), (dev)) { return dev >= 0 && dev < fake.devices ? SUCCESS : INVALID_DEVICE; }

API(cuDevicePrimaryCtxReset_v2, (CUdevice dev), (dev)) {
    if (dev < 0 || dev >= fake.devices) return INVALID_DEVICE;
    fake_reset_device(dev); /* like the driver: everything of the context is gone */
    return SUCCESS;
}

API(cuCtxCreate_v2, (struct ctx **pctx, unsigned flags, CUdevice dev), (pctx, flags, dev)) {
    (void)flags;
    if (!pctx) return INVALID_VALUE;
    if (dev < 0 || dev >= fake.devices) return INVALID_DEVICE;
    struct ctx *c = malloc(sizeof *c);
    c->device = dev;
    *pctx = t_current = c;
    return SUCCESS;
}

API(cuCtxCreate_v3, (struct ctx **pctx, void *params, int n, unsigned flags, CUdevice dev), (pctx, params, n, flags, dev)) {
    (void)params;
    (void)n;
    return impl_cuCtxCreate_v2(pctx, flags, dev);
}

API(cuCtxCreate_v4, (struct ctx **pctx, void *params, unsigned flags, CUdevice dev), (pctx, params, flags, dev)) {
    (void)params;
    return impl_cuCtxCreate_v2(pctx, flags, dev);
}

API(cuCtxDestroy_v2, (struct ctx *c), (c)) {
    if (!c) return INVALID_VALUE;
    if (t_current == c) t_current = NULL;
    if (c < g_primary || c >= g_primary + FAKE_MAX_DEVICES) free(c);
    return SUCCESS;
}

API(cuCtxSetCurrent, (struct ctx *c), (c)) {
    t_current = c;
    return SUCCESS;
}

API(cuCtxGetCurrent, (struct ctx **pc), (pc)) {
    if (!pc) return INVALID_VALUE;
    *pc = t_current;
    return SUCCESS;
}

API(cuCtxPushCurrent_v2, (struct ctx *c), (c)) {
    if (t_depth >= 16) return INVALID_VALUE;
    t_stack[t_depth++] = t_current;
    t_current = c;
    return SUCCESS;
}

API(cuCtxPopCurrent_v2, (struct ctx **pc), (pc)) {
    if (!t_depth) return INVALID_CONTEXT;
    if (pc) *pc = t_current;
    t_current = t_stack[--t_depth];
    return SUCCESS;
}

API(cuCtxGetDevice, (CUdevice *d), (d)) {
    if (!d) return INVALID_VALUE;
    if (!t_current) return INVALID_CONTEXT;
    *d = t_current->device;
    return SUCCESS;
}

API(cuCtxSynchronize, (void), ()) {
    fake_synchronize();
    return SUCCESS;
}

API(cuMemGetInfo_v2, (size_t *free, size_t *total), (free, total)) {
    int dev = current_device();
    if (dev < 0) return INVALID_CONTEXT;
    if (!free || !total) return INVALID_VALUE;
    u64 used = fake_used(dev);
    *total = fake.memory;
    *free = used > fake.memory ? 0 : fake.memory - used;
    return SUCCESS;
}

API(cuMemAlloc_v2, (CUdeviceptr *p, size_t size), (p, size)) {
    int dev = current_device();
    if (dev < 0) return INVALID_CONTEXT;
    if (!p || !size) return INVALID_VALUE;
    void *b = fake_alloc(dev, size, 1);
    if (!b) return OUT_OF_MEMORY;
    *p = (CUdeviceptr)(uintptr_t)b;
    return SUCCESS;
}

API(cuMemAllocPitch_v2, (CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned element),
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

API(cuMemAllocManaged, (CUdeviceptr *p, size_t size, unsigned flags), (p, size, flags)) {
    (void)flags;
    return impl_cuMemAlloc_v2(p, size);
}

API(cuMemFree_v2, (CUdeviceptr p), (p)) { return free_block((void *)(uintptr_t)p); }

API(cuMemCreate, (u64 *handle, size_t size, const struct alloc_prop *prop, u64 flags), (handle, size, prop, flags)) {
    (void)flags;
    if (!handle || !prop || !size) return INVALID_VALUE;
    int device_memory = prop->location.type == 1;
    if (device_memory && (prop->location.id < 0 || prop->location.id >= fake.devices)) return INVALID_DEVICE;
    void *b = fake_alloc(device_memory ? prop->location.id : 0, size, device_memory);
    if (!b) return OUT_OF_MEMORY;
    *handle = (u64)(uintptr_t)b;
    return SUCCESS;
}

API(cuMemRelease, (u64 handle), (handle)) { return free_block((void *)(uintptr_t)handle); }

API(cuMemPoolCreate, (struct pool **pool, const struct pool_props *props), (pool, props)) {
    if (!pool || !props || props->location.type != 1) return INVALID_VALUE;
    if (props->location.id < 0 || props->location.id >= fake.devices) return INVALID_DEVICE;
    *pool = malloc(sizeof **pool);
    (*pool)->device = props->location.id;
    return SUCCESS;
}

API(cuMemPoolDestroy, (struct pool *pool), (pool)) {
    free(pool);
    return SUCCESS;
}

API(cuMemAllocAsync, (CUdeviceptr *p, size_t size, void *stream), (p, size, stream)) {
    (void)stream;
    return impl_cuMemAlloc_v2(p, size);
}

API(cuMemAllocAsync_ptsz, (CUdeviceptr *p, size_t size, void *stream), (p, size, stream)) {
    (void)stream;
    return impl_cuMemAlloc_v2(p, size);
}

static CUresult alloc_from_pool(CUdeviceptr *p, size_t size, struct pool *pool) {
    if (!p || !pool || !size) return INVALID_VALUE;
    void *b = fake_alloc(pool->device, size, 1);
    if (!b) return OUT_OF_MEMORY;
    *p = (CUdeviceptr)(uintptr_t)b;
    return SUCCESS;
}

API(cuMemAllocFromPoolAsync, (CUdeviceptr *p, size_t size, struct pool *pool, void *stream), (p, size, pool, stream)) {
    (void)stream;
    return alloc_from_pool(p, size, pool);
}

API(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *p, size_t size, struct pool *pool, void *stream),
    (p, size, pool, stream)) {
    (void)stream;
    return alloc_from_pool(p, size, pool);
}

API(cuMemFreeAsync, (CUdeviceptr p, void *stream), (p, stream)) {
    (void)stream;
    return free_block((void *)(uintptr_t)p);
}

API(cuMemFreeAsync_ptsz, (CUdeviceptr p, void *stream), (p, stream)) {
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

API(cuArrayCreate_v2, (void **handle, const struct array_desc *d), (handle, d)) {
    if (!d) return INVALID_VALUE;
    return new_array(handle, array_size(d->width, d->height, 0, d->format, d->channels, 0, 1));
}

API(cuArray3DCreate_v2, (void **handle, const struct array3d_desc *d), (handle, d)) {
    if (!d) return INVALID_VALUE;
    return new_array(handle, array_size(d->width, d->height, d->depth, d->format, d->channels, d->flags, 1));
}

API(cuArrayDestroy, (void *handle), (handle)) { return free_block(handle); }

API(cuMipmappedArrayCreate, (void **handle, const struct array3d_desc *d, unsigned levels), (handle, d, levels)) {
    if (!d) return INVALID_VALUE;
    return new_array(handle, array_size(d->width, d->height, d->depth, d->format, d->channels, d->flags, levels));
}

API(cuMipmappedArrayDestroy, (void *handle), (handle)) { return free_block(handle); }

/* ---- streams, events, launches -------------------------------------------------------------------------- */

API(cuStreamCreate, (struct stream **s, unsigned flags), (s, flags)) {
    (void)flags;
    if (!s) return INVALID_VALUE;
    *s = malloc(sizeof **s);
    (*s)->device = current_device();
    return SUCCESS;
}

API(cuStreamDestroy_v2, (struct stream *s), (s)) {
    if ((uintptr_t)s > 2) free(s);
    return SUCCESS;
}

API(cuStreamSynchronize, (void *s), (s)) {
    (void)s;
    fake_synchronize();
    return SUCCESS;
}

API(cuStreamIsCapturing, (void *s, int *status), (s, status)) {
    (void)s;
    if (!status) return INVALID_VALUE;
    *status = 0;
    return SUCCESS;
}

API(cuStreamIsCapturing_ptsz, (void *s, int *status), (s, status)) { return impl_cuStreamIsCapturing(s, status); }

API(cuEventCreate, (struct event **e, unsigned flags), (e, flags)) {
    (void)flags;
    if (!e) return INVALID_VALUE;
    *e = calloc(1, sizeof **e);
    return SUCCESS;
}

API(cuEventDestroy_v2, (struct event *e), (e)) {
    free(e);
    return SUCCESS;
}

API(cuEventRecord, (struct event *e, void *stream), (e, stream)) {
    (void)stream;
    int dev = current_device();
    if (dev < 0) return INVALID_CONTEXT;
    if (!e) return INVALID_HANDLE;
    e->t = fake_reached(dev);
    e->recorded = 1;
    return SUCCESS;
}

API(cuEventRecord_ptsz, (struct event *e, void *stream), (e, stream)) { return impl_cuEventRecord(e, stream); }

API(cuEventQuery, (struct event *e), (e)) {
    if (!e) return INVALID_HANDLE;
    return fake_now_ns() >= e->t ? SUCCESS : NOT_READY;
}

API(cuEventSynchronize, (struct event *e), (e)) {
    if (!e) return INVALID_HANDLE;
    fake_sleep_until(e->t);
    return SUCCESS;
}

API(cuEventElapsedTime, (float *ms, struct event *a, struct event *b), (ms, a, b)) {
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

API(cuLaunchKernel, (void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                     unsigned shmem, void *stream, void **params, void **extra),
    (f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra)) {
    (void)bx, (void)by, (void)bz, (void)shmem, (void)stream, (void)params, (void)extra;
    if (!f) return INVALID_HANDLE;
    return run(kernel_time(gx, gy, gz));
}

API(cuLaunchKernel_ptsz, (void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shmem, void *stream, void **params, void **extra),
    (f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra)) {
    return impl_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}

API(cuLaunchCooperativeKernel, (void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                unsigned bz, unsigned shmem, void *stream, void **params),
    (f, gx, gy, gz, bx, by, bz, shmem, stream, params)) {
    return impl_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, NULL);
}

API(cuLaunchCooperativeKernel_ptsz, (void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                     unsigned bz, unsigned shmem, void *stream, void **params),
    (f, gx, gy, gz, bx, by, bz, shmem, stream, params)) {
    return impl_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, NULL);
}

API(cuLaunchKernelEx, (const struct launch_config *c, void *f, void **params, void **extra), (c, f, params, extra)) {
    (void)params, (void)extra;
    if (!c || !f) return INVALID_VALUE;
    return run(kernel_time(c->grid_x, c->grid_y, c->grid_z));
}

API(cuLaunchKernelEx_ptsz, (const struct launch_config *c, void *f, void **params, void **extra),
    (c, f, params, extra)) {
    return impl_cuLaunchKernelEx(c, f, params, extra);
}

API(cuGraphLaunch, (void *graph, void *stream), (graph, stream)) {
    (void)stream;
    if (!graph) return INVALID_HANDLE;
    return run(g_graph_ns);
}

API(cuGraphLaunch_ptsz, (void *graph, void *stream), (graph, stream)) { return impl_cuGraphLaunch(graph, stream); }

/* ---- cuGetProcAddress ------------------------------------------------------------------------------------ */

struct proc {
    const char *name;
    int version;
    int per_thread;
    void *exported;
    void *internal;
};

#define P(name, version, pt, symbol) {name, version, pt, (void *)symbol, (void *)impl_##symbol}

static CUresult impl_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, u64 flags, int *status);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, u64 flags, int *status);
static CUresult impl_cuGetProcAddress(const char *symbol, void **pfn, int version, u64 flags);
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, u64 flags);

static const struct proc g_procs[] = {
    P("cuInit", 2000, 0, cuInit),
    P("cuDriverGetVersion", 2020, 0, cuDriverGetVersion),
    P("cuGetProcAddress", 11030, 0, cuGetProcAddress),
    P("cuGetProcAddress", 12000, 0, cuGetProcAddress_v2),
    P("cuDeviceGetCount", 2000, 0, cuDeviceGetCount),
    P("cuDeviceGet", 2000, 0, cuDeviceGet),
    P("cuDeviceTotalMem", 3020, 0, cuDeviceTotalMem_v2),
    P("cuDevicePrimaryCtxRetain", 7000, 0, cuDevicePrimaryCtxRetain),
    P("cuDevicePrimaryCtxRelease", 11000, 0, cuDevicePrimaryCtxRelease_v2),
    P("cuDevicePrimaryCtxReset", 11000, 0, cuDevicePrimaryCtxReset_v2),
    P("cuCtxCreate", 3020, 0, cuCtxCreate_v2),
    P("cuCtxCreate", 11040, 0, cuCtxCreate_v3),
    P("cuCtxCreate", 12050, 0, cuCtxCreate_v4),
    P("cuCtxDestroy", 4000, 0, cuCtxDestroy_v2),
    P("cuCtxSetCurrent", 4000, 0, cuCtxSetCurrent),
    P("cuCtxGetCurrent", 4000, 0, cuCtxGetCurrent),
    P("cuCtxPushCurrent", 4000, 0, cuCtxPushCurrent_v2),
    P("cuCtxPopCurrent", 4000, 0, cuCtxPopCurrent_v2),
    P("cuCtxGetDevice", 2000, 0, cuCtxGetDevice),
    P("cuCtxSynchronize", 2000, 0, cuCtxSynchronize),
    P("cuMemGetInfo", 3020, 0, cuMemGetInfo_v2),
    P("cuMemAlloc", 3020, 0, cuMemAlloc_v2),
    P("cuMemAllocPitch", 3020, 0, cuMemAllocPitch_v2),
    P("cuMemAllocManaged", 6000, 0, cuMemAllocManaged),
    P("cuMemFree", 3020, 0, cuMemFree_v2),
    P("cuMemCreate", 10020, 0, cuMemCreate),
    P("cuMemRelease", 10020, 0, cuMemRelease),
    P("cuMemPoolCreate", 11020, 0, cuMemPoolCreate),
    P("cuMemPoolDestroy", 11020, 0, cuMemPoolDestroy),
    P("cuMemAllocAsync", 11020, 0, cuMemAllocAsync),
    P("cuMemAllocAsync", 11020, 1, cuMemAllocAsync_ptsz),
    P("cuMemAllocFromPoolAsync", 11020, 0, cuMemAllocFromPoolAsync),
    P("cuMemAllocFromPoolAsync", 11020, 1, cuMemAllocFromPoolAsync_ptsz),
    P("cuMemFreeAsync", 11020, 0, cuMemFreeAsync),
    P("cuMemFreeAsync", 11020, 1, cuMemFreeAsync_ptsz),
    P("cuArrayCreate", 3020, 0, cuArrayCreate_v2),
    P("cuArray3DCreate", 3020, 0, cuArray3DCreate_v2),
    P("cuArrayDestroy", 2000, 0, cuArrayDestroy),
    P("cuMipmappedArrayCreate", 5000, 0, cuMipmappedArrayCreate),
    P("cuMipmappedArrayDestroy", 5000, 0, cuMipmappedArrayDestroy),
    P("cuStreamCreate", 2000, 0, cuStreamCreate),
    P("cuStreamDestroy", 4000, 0, cuStreamDestroy_v2),
    P("cuStreamSynchronize", 2000, 0, cuStreamSynchronize),
    P("cuStreamIsCapturing", 10000, 0, cuStreamIsCapturing),
    P("cuStreamIsCapturing", 10000, 1, cuStreamIsCapturing_ptsz),
    P("cuEventCreate", 2000, 0, cuEventCreate),
    P("cuEventDestroy", 4000, 0, cuEventDestroy_v2),
    P("cuEventRecord", 2000, 0, cuEventRecord),
    P("cuEventRecord", 7000, 1, cuEventRecord_ptsz),
    P("cuEventQuery", 2000, 0, cuEventQuery),
    P("cuEventSynchronize", 2000, 0, cuEventSynchronize),
    P("cuEventElapsedTime", 2000, 0, cuEventElapsedTime),
    P("cuLaunchKernel", 4000, 0, cuLaunchKernel),
    P("cuLaunchKernel", 7000, 1, cuLaunchKernel_ptsz),
    P("cuLaunchKernelEx", 11060, 0, cuLaunchKernelEx),
    P("cuLaunchKernelEx", 11060, 1, cuLaunchKernelEx_ptsz),
    P("cuLaunchCooperativeKernel", 9000, 0, cuLaunchCooperativeKernel),
    P("cuLaunchCooperativeKernel", 9000, 1, cuLaunchCooperativeKernel_ptsz),
    P("cuGraphLaunch", 10000, 0, cuGraphLaunch),
    P("cuGraphLaunch", 10000, 1, cuGraphLaunch_ptsz),
};

static CUresult impl_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, u64 flags, int *status) {
    if (!symbol || !pfn) return INVALID_VALUE;
    int want = (flags & 2) ? 1 : 0, known = 0;
    const struct proc *best = NULL;
    for (int pass = want; pass >= 0 && !best; pass--)
        for (size_t i = 0; i < sizeof g_procs / sizeof *g_procs; i++) {
            const struct proc *p = &g_procs[i];
            if (strcmp(p->name, symbol)) continue;
            known = 1;
            if (p->per_thread != pass || p->version > version) continue;
            if (!best || p->version > best->version) best = p;
        }
    *pfn = best ? (g_private_procs ? best->internal : best->exported) : NULL;
    if (status) *status = best ? 0 : known ? 2 : 1;
    return best ? SUCCESS : NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, u64 flags, int *status) {
    return impl_cuGetProcAddress_v2(symbol, pfn, version, flags, status);
}

static CUresult impl_cuGetProcAddress(const char *symbol, void **pfn, int version, u64 flags) {
    return impl_cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, u64 flags) {
    return impl_cuGetProcAddress(symbol, pfn, version, flags);
}
