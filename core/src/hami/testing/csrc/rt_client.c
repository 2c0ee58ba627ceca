/*
 * rt_client.c: the vendor side of the client program the isolation tests and the benchmark drive, for a
 * CUDA-runtime-shaped runtime (hami_rt_vendor.h names it; isolation_client.c has main and the scenarios). An
 * ordinary program linked against the vendor's runtime, so its calls reach the isolation library's hooks when that is
 * preloaded:
 *
 *   init, hold, churn             SetDevice(0), Malloc / Free (out of memory: 2)
 *   stress                        every counted API: Malloc, MallocManaged, MallocAsync, MallocPitch,
 *                                 ExtMallocWithFlags, MemCreate (where the runtime has it)
 *   launch SECONDS MODES BLOCKS... launches cycling through MODES (kernel, exc, ext, coop, module, extmodule, graph;
 *                                 exc (LaunchKernelExC), ext and extmodule where the runtime has them; mixed = all
 *                                 it has)
 *   bench alloc|launch|meminfo N  Malloc + Free of 1 MiB, LaunchKernel, MemGetInfo
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "isolation_client.h"
#include "rt_api.h"

const int client_out_of_memory = 2;

void client_use_device(void) { client_check(RT_NAME(SetDevice), HAMI_RT(SetDevice)(0)); }

int client_alloc(uint64_t *p, size_t bytes) {
    void *d = NULL;
    int r = HAMI_RT(Malloc)(&d, bytes);
    *p = (uintptr_t)d;
    return r;
}

void client_free(uint64_t p) { client_check(RT_NAME(Free), HAMI_RT(Free)((void *)(uintptr_t)p)); }

#if defined(HAMI_RT_HAS_VMM) && HAMI_RT_HAS_VMM
enum { A_MALLOC, A_MANAGED, A_ASYNC, A_PITCH, A_EXT, A_VMM, A_KINDS };
#else
enum { A_MALLOC, A_MANAGED, A_ASYNC, A_PITCH, A_EXT, A_KINDS, A_VMM };
#endif

const int client_kinds = A_KINDS;

void *client_stress_begin(void) { return NULL; }

void client_stress_end(void *context) { (void)context; }

int client_allocate(int kind, size_t bytes, void *context, uint64_t *handle) {
    (void)context;
    void *p = NULL;
    int r;
    switch (kind) {
    case A_MALLOC: r = HAMI_RT(Malloc)(&p, bytes); break;
    case A_MANAGED: r = HAMI_RT(MallocManaged)(&p, bytes, 1); break;
    case A_ASYNC: r = HAMI_RT(MallocAsync)(&p, bytes, NULL); break;
    case A_PITCH: {
        size_t pitch = 0;
        r = HAMI_RT(MallocPitch)(&p, &pitch, bytes / 4 + 1, 4);
        break;
    }
    case A_EXT: r = HAMI_RT(ExtMallocWithFlags)(&p, bytes, 0); break;
    default: {
#if defined(HAMI_RT_HAS_VMM) && HAMI_RT_HAS_VMM
        rt_mem_prop prop = {1, 0, {1, 0}, NULL, {0, 0, 0}};
        unsigned long long h = 0;
        r = HAMI_RT(MemCreate)(&h, bytes, &prop, 0);
        p = (void *)(uintptr_t)h;
#else
        r = -1;
#endif
    }
    }
    *handle = (uintptr_t)p;
    return r;
}

void client_release(int kind, uint64_t handle) {
    void *p = (void *)(uintptr_t)handle;
    switch (kind) {
    case A_ASYNC: client_check(RT_NAME(FreeAsync), HAMI_RT(FreeAsync)(p, NULL)); break;
#if defined(HAMI_RT_HAS_VMM) && HAMI_RT_HAS_VMM
    case A_VMM: client_check(RT_NAME(MemRelease), HAMI_RT(MemRelease)((unsigned long long)handle)); break;
#endif
    default: client_check(RT_NAME(Free), HAMI_RT(Free)(p)); break;
    }
}

#if defined(HAMI_RT_HAS_LAUNCH_EXC) && HAMI_RT_HAS_LAUNCH_EXC
#define EXC_MODE "exc,"
#else
#define EXC_MODE ""
#endif
#if defined(HAMI_RT_HAS_EXT_LAUNCH) && HAMI_RT_HAS_EXT_LAUNCH
#define ALL_MODES "kernel," EXC_MODE "ext,coop,module,extmodule,graph"
#else
#define ALL_MODES "kernel," EXC_MODE "coop,module,graph"
#endif
static const char *const MODES[] = {"kernel", "exc", "ext", "coop", "module", "extmodule", "graph"};
#define N_MODES (sizeof MODES / sizeof *MODES)

static int launch(const char *mode, void *kernel, uint32_t blocks) {
    rt_dim3 grid = {blocks, 1, 1}, block = {64, 1, 1};
    if (!strcmp(mode, "kernel")) return HAMI_RT(LaunchKernel)(kernel, grid, block, NULL, 0, NULL);
#if defined(HAMI_RT_HAS_LAUNCH_EXC) && HAMI_RT_HAS_LAUNCH_EXC
    if (!strcmp(mode, "exc")) {
        rt_launch_config config = {.gridDim = grid, .blockDim = block};
        return HAMI_RT(LaunchKernelExC)(&config, kernel, NULL);
    }
#endif
#if defined(HAMI_RT_HAS_EXT_LAUNCH) && HAMI_RT_HAS_EXT_LAUNCH
    if (!strcmp(mode, "ext")) return HAMI_RT(ExtLaunchKernel)(kernel, grid, block, NULL, 0, NULL, NULL, NULL, 0);
#endif
    if (!strcmp(mode, "coop")) return HAMI_RT(LaunchCooperativeKernel)(kernel, grid, block, NULL, 0, NULL);
    if (!strcmp(mode, "module"))
        return HAMI_RT(ModuleLaunchKernel)((void *)kernel, blocks, 1, 1, 64, 1, 1, 0, NULL, NULL, NULL);
#if defined(HAMI_RT_HAS_EXT_LAUNCH) && HAMI_RT_HAS_EXT_LAUNCH
    if (!strcmp(mode, "extmodule"))
        return HAMI_RT(ExtModuleLaunchKernel)((void *)kernel, blocks * 64, 1, 1, 64, 1, 1, 0, NULL, NULL, NULL, NULL,
                                              NULL, 0);
#endif
    if (!strcmp(mode, "graph")) return HAMI_RT(GraphLaunch)((void *)kernel, NULL);
    return -1;
}

int client_launch(double seconds, const char *mode, uint32_t *grids, int ngrids) {
    client_use_device();
    const char *modes[N_MODES];
    size_t nmodes = 0;
    char *list = strdup(strcmp(mode, "mixed") ? mode : ALL_MODES);
    for (char *save = NULL, *m = strtok_r(list, ",", &save); m && nmodes < N_MODES; m = strtok_r(NULL, ",", &save))
        modes[nmodes++] = m;
    void *kernels[4] = {(void *)0x1000, (void *)0x2000, (void *)0x3000, (void *)0x4000};
    long launches = 0;
    double end = client_now_s() + seconds;
    while (client_now_s() < end) {
        for (int i = 0; i < 16; i++, launches++) {
            const char *m = modes[launches % (long)nmodes];
            int r = launch(m, kernels[launches % ngrids % 4], grids[launches % ngrids]);
            if (r != 0) client_die(m, r);
        }
    }
    HAMI_RT(DeviceSynchronize)();
    printf("{\"launches\": %ld}\n", launches);
    free(list);
    return 0;
}

double client_bench_round(const char *what, long n) {
    void *p;
    size_t free_b, total;
    rt_dim3 grid = {1, 1, 1}, block = {64, 1, 1};
    double t0 = client_now_s();
    if (!strcmp(what, "alloc")) {
        for (long i = 0; i < n; i++) {
            if (HAMI_RT(Malloc)(&p, 1 << 20) != 0) client_die(RT_NAME(Malloc), 1);
            HAMI_RT(Free)(p);
        }
    } else if (!strcmp(what, "launch")) {
        for (long i = 0; i < n; i++) HAMI_RT(LaunchKernel)((void *)0x1000, grid, block, NULL, 0, NULL);
    } else {
        for (long i = 0; i < n; i++) HAMI_RT(MemGetInfo)(&free_b, &total);
    }
    return (client_now_s() - t0) / (double)n * 1e9;
}
