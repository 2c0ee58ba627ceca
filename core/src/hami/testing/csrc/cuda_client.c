/*
 * cuda_client.c: the CUDA side of the client program a CUDA-compatible vendor's isolation tests and benchmark drive
 * (isolation_client.c has main and the scenarios, isolation_client.h lists the subcommands). An ordinary CUDA
 * driver API program, linked against the driver (libcuda.so.1), so its calls reach the isolation library's
 * exported wrappers when that is preloaded. What is CUDA's here:
 *
 *   init, hold, churn             cuInit, a context, cuMemAlloc_v2 / cuMemFree_v2 (out of memory: 2)
 *   stress                        every counted API: cuMemAlloc_v2, Pitch, Managed, Async(_ptsz), from a pool, VMM
 *                                 (cuMemCreate), arrays, 3D arrays, mipmapped arrays
 *   launch SECONDS MODE GRID...   launches kernels for SECONDS (MODE kernel|ptsz|ex|coop|graph)
 *   bench alloc|launch|meminfo N  cuMemAlloc_v2 + cuMemFree_v2 of 1 MiB, cuLaunchKernel, cuMemGetInfo_v2
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "isolation_client.h"

/* The driver's names (as in fake_cuda.c): cu*, or -DFAKE_CU_PREFIX=mu for CUDA's API under another prefix. */
#ifndef FAKE_CU_PREFIX
#define FAKE_CU_PREFIX cu
#endif
#define FAKE_PASTE(a, b) FAKE_PASTE_(a, b)
#define FAKE_PASTE_(a, b) a##b
#define FAKE_CU(suffix) FAKE_PASTE(FAKE_CU_PREFIX, suffix)

/* What came after CUDA 10.2 is weak (an older driver does not have it, and the isolation library in front may
 * export a hook of it anyway): the client asks the driver's version and on an older driver uses cuMemAlloc_v2 and
 * cuLaunchKernel in its place, as an application written for that driver would. */
#define NEWER __attribute__((weak))
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;

struct location { int type, id; };
struct alloc_prop { int type, handle_types; struct location location; void *win32; unsigned char flags[8]; };
struct pool_props { int alloc_type, handle_types; struct location location; void *win32; size_t max; unsigned short usage; unsigned char reserved[54]; };
struct array_desc { size_t width, height; int format; unsigned channels; };
struct array3d_desc { size_t width, height, depth; int format; unsigned channels, flags; };
struct launch_config { unsigned gx, gy, gz, bx, by, bz, shmem; CUstream stream; void *attrs; unsigned nattrs; };

CUresult FAKE_CU(Init)(unsigned);
CUresult FAKE_CU(DevicePrimaryCtxRetain)(CUcontext *, int);
CUresult FAKE_CU(CtxSetCurrent)(CUcontext);
CUresult FAKE_CU(CtxSynchronize)(void);
CUresult FAKE_CU(MemAlloc_v2)(CUdeviceptr *, size_t);
CUresult FAKE_CU(MemAllocPitch_v2)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult FAKE_CU(MemAllocManaged)(CUdeviceptr *, size_t, unsigned);
CUresult FAKE_CU(MemFree_v2)(CUdeviceptr);
CUresult FAKE_CU(MemCreate)(unsigned long long *, size_t, const struct alloc_prop *, unsigned long long);
CUresult FAKE_CU(MemRelease)(unsigned long long);
NEWER CUresult FAKE_CU(MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
NEWER CUresult FAKE_CU(MemAllocAsync_ptsz)(CUdeviceptr *, size_t, CUstream);
NEWER CUresult FAKE_CU(MemFreeAsync)(CUdeviceptr, CUstream);
NEWER CUresult FAKE_CU(MemPoolCreate)(void **, const struct pool_props *);
NEWER CUresult FAKE_CU(MemPoolDestroy)(void *);
NEWER CUresult FAKE_CU(MemAllocFromPoolAsync)(CUdeviceptr *, size_t, void *, CUstream);
CUresult FAKE_CU(ArrayCreate_v2)(void **, const struct array_desc *);
CUresult FAKE_CU(Array3DCreate_v2)(void **, const struct array3d_desc *);
CUresult FAKE_CU(ArrayDestroy)(void *);
CUresult FAKE_CU(MipmappedArrayCreate)(void **, const struct array3d_desc *, unsigned);
CUresult FAKE_CU(MipmappedArrayDestroy)(void *);
CUresult FAKE_CU(MemGetInfo_v2)(size_t *, size_t *);
CUresult FAKE_CU(LaunchKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
CUresult FAKE_CU(LaunchKernel_ptsz)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
NEWER CUresult FAKE_CU(LaunchKernelEx)(const struct launch_config *, void *, void **, void **);
CUresult FAKE_CU(LaunchCooperativeKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
CUresult FAKE_CU(GraphLaunch)(void *, CUstream);

CUresult FAKE_CU(DriverGetVersion)(int *);

static int driver_has(int version) {
    static int known = -1;
    if (known < 0) {
        int v = 0;
        known = FAKE_CU(DriverGetVersion)(&v) == 0 ? v : 0;
    }
    return known >= version;
}

enum { OK = 0, OOM = 2 };

const int client_out_of_memory = OOM;

static void do_init(void) { client_check("cuInit", FAKE_CU(Init)(0)); }

void client_use_device(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, do_init);
    CUcontext ctx;
    client_check("cuDevicePrimaryCtxRetain", FAKE_CU(DevicePrimaryCtxRetain)(&ctx, 0));
    client_check("cuCtxSetCurrent", FAKE_CU(CtxSetCurrent)(ctx));
}

int client_alloc(uint64_t *p, size_t bytes) {
    CUdeviceptr d = 0;
    CUresult r = FAKE_CU(MemAlloc_v2)(&d, bytes);
    *p = d;
    return r;
}

void client_free(uint64_t p) { client_check("cuMemFree_v2", FAKE_CU(MemFree_v2)(p)); }

/* ---- allocations through every counted API --------------------------------------------------------------- */

enum { A_ALLOC, A_PITCH, A_MANAGED, A_ASYNC, A_ASYNC_PTSZ, A_POOL, A_VMM, A_ARRAY, A_ARRAY3D, A_MIPMAP, A_KINDS };

const int client_kinds = A_KINDS;

void *client_stress_begin(void) {
    struct pool_props props;
    memset(&props, 0, sizeof props);
    props.alloc_type = 1;
    props.location.type = 1;
    props.location.id = 0;
    void *pool = NULL;
    if (FAKE_CU(MemPoolCreate) && driver_has(11020)) client_check("cuMemPoolCreate", FAKE_CU(MemPoolCreate)(&pool, &props));
    return pool;
}

void client_stress_end(void *pool) {
    if (pool) client_check("cuMemPoolDestroy", FAKE_CU(MemPoolDestroy)(pool));
}

int client_allocate(int kind, size_t bytes, void *pool, uint64_t *handle) {
    CUdeviceptr p = 0;
    void *a = NULL;
    size_t pitch;
    CUresult r;
    if (((kind == A_ASYNC || kind == A_ASYNC_PTSZ) && !driver_has(11020)) || (kind == A_POOL && !pool))
        kind = A_ALLOC; /* an older driver: plain allocations in their place */
    switch (kind) {
    case A_ALLOC: r = FAKE_CU(MemAlloc_v2)(&p, bytes); break;
    case A_PITCH: r = FAKE_CU(MemAllocPitch_v2)(&p, &pitch, 1000, bytes / 1024 + 1, 4); break;
    case A_MANAGED: r = FAKE_CU(MemAllocManaged)(&p, bytes, 1); break;
    case A_ASYNC: r = FAKE_CU(MemAllocAsync)(&p, bytes, NULL); break;
    case A_ASYNC_PTSZ: r = FAKE_CU(MemAllocAsync_ptsz)(&p, bytes, NULL); break;
    case A_POOL: r = FAKE_CU(MemAllocFromPoolAsync)(&p, bytes, pool, NULL); break;
    case A_VMM: {
        struct alloc_prop prop = {1, 0, {1, 0}, NULL, {0}};
        unsigned long long vmm = 0;
        r = FAKE_CU(MemCreate)(&vmm, bytes, &prop, 0);
        *handle = vmm;
        return r;
    }
    case A_ARRAY: {
        struct array_desc d = {1024, bytes / 4096 + 1, 0x20, 1};
        r = FAKE_CU(ArrayCreate_v2)(&a, &d);
        *handle = (uintptr_t)a;
        return r;
    }
    case A_ARRAY3D: {
        struct array3d_desc d = {256, 16, bytes / 8192 + 1, 0x02, 1, 0};
        r = FAKE_CU(Array3DCreate_v2)(&a, &d);
        *handle = (uintptr_t)a;
        return r;
    }
    default: {
        struct array3d_desc d = {512, bytes / 4096 + 1, 0, 0x01, 4, 0};
        r = FAKE_CU(MipmappedArrayCreate)(&a, &d, 4);
        *handle = (uintptr_t)a;
        return r;
    }
    }
    *handle = p;
    return r;
}

void client_release(int kind, uint64_t handle) {
    switch (kind) {
    case A_VMM: client_check("cuMemRelease", FAKE_CU(MemRelease)(handle)); break;
    case A_ARRAY: case A_ARRAY3D: client_check("cuArrayDestroy", FAKE_CU(ArrayDestroy)((void *)(uintptr_t)handle)); break;
    case A_MIPMAP: client_check("cuMipmappedArrayDestroy", FAKE_CU(MipmappedArrayDestroy)((void *)(uintptr_t)handle)); break;
    case A_ASYNC: case A_POOL:
        if (driver_has(11020)) {
            client_check("cuMemFreeAsync", FAKE_CU(MemFreeAsync)(handle, NULL));
            break;
        }
        __attribute__((fallthrough)); /* allocated with cuMemAlloc_v2 on an older driver */
    default: client_check("cuMemFree_v2", FAKE_CU(MemFree_v2)(handle)); break;
    }
}

/* ---- launches and the benchmark -------------------------------------------------------------------------- */

int client_launch(double seconds, const char *mode, uint32_t *grids, int ngrids) {
    client_use_device();
    void *kernels[4] = {(void *)0x1000, (void *)0x2000, (void *)0x3000, (void *)0x4000};
    long launches = 0;
    double end = client_now_s() + seconds;
    while (client_now_s() < end) {
        for (int i = 0; i < 16; i++, launches++) {
            unsigned grid = grids[launches % ngrids];
            void *kernel = kernels[launches % ngrids % 4];
            CUresult r;
            if (!strcmp(mode, "ptsz")) r = FAKE_CU(LaunchKernel_ptsz)(kernel, grid, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
            else if (!strcmp(mode, "ex") && driver_has(11060)) {
                struct launch_config c = {grid, 1, 1, 128, 1, 1, 0, NULL, NULL, 0};
                r = FAKE_CU(LaunchKernelEx)(&c, kernel, NULL, NULL);
            } else if (!strcmp(mode, "coop"))
                r = FAKE_CU(LaunchCooperativeKernel)(kernel, grid, 1, 1, 128, 1, 1, 0, NULL, NULL);
            else if (!strcmp(mode, "graph")) r = FAKE_CU(GraphLaunch)(kernel, NULL);
            else r = FAKE_CU(LaunchKernel)(kernel, grid, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
            if (r != OK) client_die("launch", r);
        }
    }
    FAKE_CU(CtxSynchronize)();
    printf("{\"launches\": %ld}\n", launches);
    return 0;
}

double client_bench_round(const char *what, long n) {
    CUdeviceptr p;
    size_t free, total;
    double t0 = client_now_s();
    if (!strcmp(what, "alloc")) {
        for (long i = 0; i < n; i++) {
            if (FAKE_CU(MemAlloc_v2)(&p, 1 << 20) != OK) client_die("cuMemAlloc_v2", 1);
            FAKE_CU(MemFree_v2)(p);
        }
    } else if (!strcmp(what, "launch")) {
        for (long i = 0; i < n; i++) FAKE_CU(LaunchKernel)((void *)0x1000, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    } else {
        for (long i = 0; i < n; i++) FAKE_CU(MemGetInfo_v2)(&free, &total);
    }
    return (client_now_s() - t0) / (double)n * 1e9;
}
