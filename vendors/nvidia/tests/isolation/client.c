/*
 * client.c: the CUDA side of the client program the isolation tests and the benchmark drive (hami.testing's
 * isolation_client.c has main and the scenarios, isolation_client.h lists the subcommands). An ordinary CUDA driver
 * API program, linked against libcuda.so.1, so its calls reach libvgpu.so's exported wrappers when that is
 * preloaded. What is CUDA's here:
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

CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, int);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemCreate(unsigned long long *, size_t, const struct alloc_prop *, unsigned long long);
CUresult cuMemRelease(unsigned long long);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemPoolCreate(void **, const struct pool_props *);
CUresult cuMemPoolDestroy(void *);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, void *, CUstream);
CUresult cuArrayCreate_v2(void **, const struct array_desc *);
CUresult cuArray3DCreate_v2(void **, const struct array3d_desc *);
CUresult cuArrayDestroy(void *);
CUresult cuMipmappedArrayCreate(void **, const struct array3d_desc *, unsigned);
CUresult cuMipmappedArrayDestroy(void *);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernel_ptsz(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx(const struct launch_config *, void *, void **, void **);
CUresult cuLaunchCooperativeKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
CUresult cuGraphLaunch(void *, CUstream);

enum { OK = 0, OOM = 2 };

const int client_out_of_memory = OOM;

static void do_init(void) { client_check("cuInit", cuInit(0)); }

void client_use_device(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, do_init);
    CUcontext ctx;
    client_check("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&ctx, 0));
    client_check("cuCtxSetCurrent", cuCtxSetCurrent(ctx));
}

int client_alloc(uint64_t *p, size_t bytes) {
    CUdeviceptr d = 0;
    CUresult r = cuMemAlloc_v2(&d, bytes);
    *p = d;
    return r;
}

void client_free(uint64_t p) { client_check("cuMemFree_v2", cuMemFree_v2(p)); }

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
    client_check("cuMemPoolCreate", cuMemPoolCreate(&pool, &props));
    return pool;
}

void client_stress_end(void *pool) { client_check("cuMemPoolDestroy", cuMemPoolDestroy(pool)); }

int client_allocate(int kind, size_t bytes, void *pool, uint64_t *handle) {
    CUdeviceptr p = 0;
    void *a = NULL;
    size_t pitch;
    CUresult r;
    switch (kind) {
    case A_ALLOC: r = cuMemAlloc_v2(&p, bytes); break;
    case A_PITCH: r = cuMemAllocPitch_v2(&p, &pitch, 1000, bytes / 1024 + 1, 4); break;
    case A_MANAGED: r = cuMemAllocManaged(&p, bytes, 1); break;
    case A_ASYNC: r = cuMemAllocAsync(&p, bytes, NULL); break;
    case A_ASYNC_PTSZ: r = cuMemAllocAsync_ptsz(&p, bytes, NULL); break;
    case A_POOL: r = cuMemAllocFromPoolAsync(&p, bytes, pool, NULL); break;
    case A_VMM: {
        struct alloc_prop prop = {1, 0, {1, 0}, NULL, {0}};
        unsigned long long vmm = 0;
        r = cuMemCreate(&vmm, bytes, &prop, 0);
        *handle = vmm;
        return r;
    }
    case A_ARRAY: {
        struct array_desc d = {1024, bytes / 4096 + 1, 0x20, 1};
        r = cuArrayCreate_v2(&a, &d);
        *handle = (uintptr_t)a;
        return r;
    }
    case A_ARRAY3D: {
        struct array3d_desc d = {256, 16, bytes / 8192 + 1, 0x02, 1, 0};
        r = cuArray3DCreate_v2(&a, &d);
        *handle = (uintptr_t)a;
        return r;
    }
    default: {
        struct array3d_desc d = {512, bytes / 4096 + 1, 0, 0x01, 4, 0};
        r = cuMipmappedArrayCreate(&a, &d, 4);
        *handle = (uintptr_t)a;
        return r;
    }
    }
    *handle = p;
    return r;
}

void client_release(int kind, uint64_t handle) {
    switch (kind) {
    case A_VMM: client_check("cuMemRelease", cuMemRelease(handle)); break;
    case A_ARRAY: case A_ARRAY3D: client_check("cuArrayDestroy", cuArrayDestroy((void *)(uintptr_t)handle)); break;
    case A_MIPMAP: client_check("cuMipmappedArrayDestroy", cuMipmappedArrayDestroy((void *)(uintptr_t)handle)); break;
    case A_ASYNC: case A_POOL: client_check("cuMemFreeAsync", cuMemFreeAsync(handle, NULL)); break;
    default: client_check("cuMemFree_v2", cuMemFree_v2(handle)); break;
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
            if (!strcmp(mode, "ptsz")) r = cuLaunchKernel_ptsz(kernel, grid, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
            else if (!strcmp(mode, "ex")) {
                struct launch_config c = {grid, 1, 1, 128, 1, 1, 0, NULL, NULL, 0};
                r = cuLaunchKernelEx(&c, kernel, NULL, NULL);
            } else if (!strcmp(mode, "coop"))
                r = cuLaunchCooperativeKernel(kernel, grid, 1, 1, 128, 1, 1, 0, NULL, NULL);
            else if (!strcmp(mode, "graph")) r = cuGraphLaunch(kernel, NULL);
            else r = cuLaunchKernel(kernel, grid, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
            if (r != OK) client_die("launch", r);
        }
    }
    cuCtxSynchronize();
    printf("{\"launches\": %ld}\n", launches);
    return 0;
}

double client_bench_round(const char *what, long n) {
    CUdeviceptr p;
    size_t free, total;
    double t0 = client_now_s();
    if (!strcmp(what, "alloc")) {
        for (long i = 0; i < n; i++) {
            if (cuMemAlloc_v2(&p, 1 << 20) != OK) client_die("cuMemAlloc_v2", 1);
            cuMemFree_v2(p);
        }
    } else if (!strcmp(what, "launch")) {
        for (long i = 0; i < n; i++) cuLaunchKernel((void *)0x1000, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    } else {
        for (long i = 0; i < n; i++) cuMemGetInfo_v2(&free, &total);
    }
    return (client_now_s() - t0) / (double)n * 1e9;
}
