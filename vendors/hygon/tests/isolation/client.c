/*
 * client.c: the Hygon side of the client program the isolation tests and the benchmark drive (hami.testing's
 * isolation_client.c has main and the scenarios). An ordinary HIP program linked against libgalaxyhip.so, so its
 * calls reach libvdcu.so's hooks when that is preloaded:
 *
 *   init, hold, churn             hipSetDevice(0), hipMalloc / hipFree (out of memory: hipErrorOutOfMemory, 2)
 *   stress                        every counted API: hipMalloc, hipMallocManaged, hipMallocAsync, hipMallocPitch,
 *                                 hipExtMallocWithFlags, hipMemCreate
 *   launch SECONDS MODES BLOCKS... launches cycling through MODES (kernel, ext, coop, module, extmodule, graph;
 *                                 mixed = all)
 *   bench alloc|launch|meminfo N  hipMalloc + hipFree of 1 MiB, hipLaunchKernel, hipMemGetInfo
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hip_api.h"
#include "isolation_client.h"

hipError_t hipDeviceSynchronize(void);

const int client_out_of_memory = hipErrorOutOfMemory;

void client_use_device(void) { client_check("hipSetDevice", hipSetDevice(0)); }

int client_alloc(uint64_t *p, size_t bytes) {
    void *d = NULL;
    int r = hipMalloc(&d, bytes);
    *p = (uintptr_t)d;
    return r;
}

void client_free(uint64_t p) { client_check("hipFree", hipFree((void *)(uintptr_t)p)); }

enum { A_MALLOC, A_MANAGED, A_ASYNC, A_PITCH, A_EXT, A_VMM, A_KINDS };

const int client_kinds = A_KINDS;

void *client_stress_begin(void) { return NULL; }

void client_stress_end(void *context) { (void)context; }

int client_allocate(int kind, size_t bytes, void *context, uint64_t *handle) {
    (void)context;
    void *p = NULL;
    int r;
    switch (kind) {
    case A_MALLOC: r = hipMalloc(&p, bytes); break;
    case A_MANAGED: r = hipMallocManaged(&p, bytes, 1); break;
    case A_ASYNC: r = hipMallocAsync(&p, bytes, NULL); break;
    case A_PITCH: {
        size_t pitch = 0;
        r = hipMallocPitch(&p, &pitch, bytes / 4 + 1, 4);
        break;
    }
    case A_EXT: r = hipExtMallocWithFlags(&p, bytes, 0); break;
    default: {
        hipMemAllocationProp prop = {1, 0, {hipMemLocationTypeDevice, 0}, NULL, {0, 0, 0}};
        hipMemGenericAllocationHandle_t h = 0;
        r = hipMemCreate(&h, bytes, &prop, 0);
        p = (void *)(uintptr_t)h;
    }
    }
    *handle = (uintptr_t)p;
    return r;
}

void client_release(int kind, uint64_t handle) {
    void *p = (void *)(uintptr_t)handle;
    switch (kind) {
    case A_ASYNC: client_check("hipFreeAsync", hipFreeAsync(p, NULL)); break;
    case A_VMM: client_check("hipMemRelease", hipMemRelease((hipMemGenericAllocationHandle_t)handle)); break;
    default: client_check("hipFree", hipFree(p)); break;
    }
}

static const char *const MODES[] = {"kernel", "ext", "coop", "module", "extmodule", "graph"};
#define N_MODES (sizeof MODES / sizeof *MODES)

static int launch(const char *mode, void *kernel, uint32_t blocks) {
    dim3 grid = {blocks, 1, 1}, block = {64, 1, 1};
    if (!strcmp(mode, "kernel")) return hipLaunchKernel(kernel, grid, block, NULL, 0, NULL);
    if (!strcmp(mode, "ext")) return hipExtLaunchKernel(kernel, grid, block, NULL, 0, NULL, NULL, NULL, 0);
    if (!strcmp(mode, "coop")) return hipLaunchCooperativeKernel(kernel, grid, block, NULL, 0, NULL);
    if (!strcmp(mode, "module"))
        return hipModuleLaunchKernel((hipFunction_t)kernel, blocks, 1, 1, 64, 1, 1, 0, NULL, NULL, NULL);
    if (!strcmp(mode, "extmodule"))
        return hipExtModuleLaunchKernel((hipFunction_t)kernel, blocks * 64, 1, 1, 64, 1, 1, 0, NULL, NULL, NULL, NULL,
                                        NULL, 0);
    if (!strcmp(mode, "graph")) return hipGraphLaunch((hipGraphExec_t)kernel, NULL);
    return -1;
}

int client_launch(double seconds, const char *mode, uint32_t *grids, int ngrids) {
    client_use_device();
    const char *modes[N_MODES];
    size_t nmodes = 0;
    char *list = strdup(strcmp(mode, "mixed") ? mode : "kernel,ext,coop,module,extmodule,graph");
    for (char *save = NULL, *m = strtok_r(list, ",", &save); m && nmodes < N_MODES; m = strtok_r(NULL, ",", &save))
        modes[nmodes++] = m;
    void *kernels[4] = {(void *)0x1000, (void *)0x2000, (void *)0x3000, (void *)0x4000};
    long launches = 0;
    double end = client_now_s() + seconds;
    while (client_now_s() < end) {
        for (int i = 0; i < 16; i++, launches++) {
            const char *m = modes[launches % (long)nmodes];
            int r = launch(m, kernels[launches % ngrids % 4], grids[launches % ngrids]);
            if (r != hipSuccess) client_die(m, r);
        }
    }
    hipDeviceSynchronize();
    printf("{\"launches\": %ld}\n", launches);
    free(list);
    return 0;
}

double client_bench_round(const char *what, long n) {
    void *p;
    size_t free_b, total;
    dim3 grid = {1, 1, 1}, block = {64, 1, 1};
    double t0 = client_now_s();
    if (!strcmp(what, "alloc")) {
        for (long i = 0; i < n; i++) {
            if (hipMalloc(&p, 1 << 20) != hipSuccess) client_die("hipMalloc", 1);
            hipFree(p);
        }
    } else if (!strcmp(what, "launch")) {
        for (long i = 0; i < n; i++) hipLaunchKernel((void *)0x1000, grid, block, NULL, 0, NULL);
    } else {
        for (long i = 0; i < n; i++) hipMemGetInfo(&free_b, &total);
    }
    return (client_now_s() - t0) / (double)n * 1e9;
}
