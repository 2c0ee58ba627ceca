/*
 * client.c: the Cambricon side of the client program the isolation tests and the benchmark drive (hami.testing's
 * isolation_client.c has main and the scenarios). An ordinary MLU program linked against libcnrt.so and
 * libcndrv.so, so its calls reach libvmlu.so's hooks when that is preloaded:
 *
 *   init, hold, churn             cnrtSetDevice(0), cnrtMalloc / cnrtFree (out of memory: cnrtErrorNoMem, 100100)
 *   stress                        every counted API: cnrtMalloc, cnMalloc, cnZmalloc, cnMallocNode,
 *                                 cnMallocConstant, cnMemAllocAsync, cnMemCreate
 *   launch SECONDS MODES BLOCKS... launches cycling through MODES (rt: cnrtInvokeKernel, cn: cnInvokeKernel,
 *                                 ex: cnInvokeKernelEx; mixed = all)
 *   bench alloc|launch|meminfo N  cnrtMalloc + cnrtFree of 1 MiB, cnrtInvokeKernel, cnrtMemGetInfo
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cn_api.h"
#include "isolation_client.h"

const int client_out_of_memory = cnrtErrorNoMem;

void client_use_device(void) { client_check("cnrtSetDevice", cnrtSetDevice(0)); }

int client_alloc(uint64_t *p, size_t bytes) {
    void *d = NULL;
    int r = cnrtMalloc(&d, bytes);
    *p = (uintptr_t)d;
    return r;
}

void client_free(uint64_t p) { client_check("cnrtFree", cnrtFree((void *)(uintptr_t)p)); }

enum { A_RT, A_CN, A_ZERO, A_NODE, A_CONST, A_ASYNC, A_VMM, A_KINDS };

const int client_kinds = A_KINDS;

void *client_stress_begin(void) { return NULL; }

void client_stress_end(void *context) { (void)context; }

int client_allocate(int kind, size_t bytes, void *context, uint64_t *handle) {
    (void)context;
    CNaddr a = 0;
    int r;
    switch (kind) {
    case A_RT: {
        void *p = NULL;
        r = cnrtMalloc(&p, bytes);
        a = (CNaddr)(uintptr_t)p;
        break;
    }
    case A_CN: r = cnMalloc(&a, bytes); break;
    case A_ZERO: r = cnZmalloc(&a, bytes); break;
    case A_NODE: r = cnMallocNode(&a, bytes, 0); break;
    case A_CONST: r = cnMallocConstant(&a, bytes); break;
    case A_ASYNC: r = cnMemAllocAsync(&a, bytes, NULL); break;
    default: {
        CNmemGenericAllocationHandle h = 0;
        r = cnMemCreate(&h, bytes, NULL, 0);
        a = (CNaddr)h;
    }
    }
    *handle = a;
    return r;
}

void client_release(int kind, uint64_t handle) {
    switch (kind) {
    case A_RT: client_check("cnrtFree", cnrtFree((void *)(uintptr_t)handle)); break;
    case A_ASYNC: client_check("cnMemFreeAsync", cnMemFreeAsync((CNaddr)handle, NULL)); break;
    case A_VMM: client_check("cnMemRelease", cnMemRelease((CNmemGenericAllocationHandle)handle)); break;
    default: client_check("cnFree", cnFree((CNaddr)handle)); break;
    }
}

static const char *const MODES[] = {"rt", "cn", "ex"};
#define N_MODES (sizeof MODES / sizeof *MODES)

static int launch(const char *mode, void *kernel, uint32_t blocks) {
    if (!strcmp(mode, "rt")) {
        cnrtDim3_t dim = {blocks, 1, 1};
        return cnrtInvokeKernel(kernel, dim, 1, NULL, 0, NULL);
    }
    if (!strcmp(mode, "cn")) return cnInvokeKernel((CNkernel)kernel, blocks, 1, 1, 1, 0, NULL, NULL, NULL);
    if (!strcmp(mode, "ex")) return cnInvokeKernelEx(NULL, (CNkernel)kernel, NULL, NULL);
    return -1;
}

int client_launch(double seconds, const char *mode, uint32_t *grids, int ngrids) {
    client_use_device();
    const char *modes[N_MODES];
    size_t nmodes = 0;
    char *list = strdup(strcmp(mode, "mixed") ? mode : "rt,cn,ex");
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
    cnrtSyncDevice();
    printf("{\"launches\": %ld}\n", launches);
    free(list);
    return 0;
}

double client_bench_round(const char *what, long n) {
    void *p;
    size_t free_b, total;
    cnrtDim3_t dim = {1, 1, 1};
    double t0 = client_now_s();
    if (!strcmp(what, "alloc")) {
        for (long i = 0; i < n; i++) {
            if (cnrtMalloc(&p, 1 << 20) != cnrtSuccess) client_die("cnrtMalloc", 1);
            cnrtFree(p);
        }
    } else if (!strcmp(what, "launch")) {
        for (long i = 0; i < n; i++) cnrtInvokeKernel((void *)0x1000, dim, 1, NULL, 0, NULL);
    } else {
        for (long i = 0; i < n; i++) cnrtMemGetInfo(&free_b, &total);
    }
    return (client_now_s() - t0) / (double)n * 1e9;
}
