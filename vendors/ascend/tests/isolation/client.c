/*
 * client.c: the Ascend side of the client program the isolation tests and the benchmark drive (hami.testing's
 * isolation_client.c has main and the scenarios, isolation_client.h lists the subcommands). An ordinary Ascend
 * program, linked against libascendcl.so and libruntime.so, so its calls reach libvnpu.so's hooks when that is
 * preloaded, using both layers as applications do (AscendCL directly, graph engines the runtime). What is Ascend's
 * here:
 *
 *   init, hold, churn             aclrtSetDevice(0), rtMalloc / rtFree (out of memory: 207001)
 *   stress                        every counted API of both layers: rtMalloc, rtMallocPhysical, aclrtMalloc,
 *                                 aclrtMallocAlign32, aclrtMallocCached, aclrtMallocPhysical
 *   launch SECONDS MODES BLOCKS... launches for SECONDS, cycling through MODES (a comma list of kernel, flag,
 *                                 handle, aicpu, model, acl, op, mdl; mixed = all of them) and BLOCKS
 *   bench alloc|aclalloc|launch|meminfo N   rtMalloc + rtFree of 1 MiB, aclrtMalloc + aclrtFree, rtKernelLaunch,
 *                                 rtMemGetInfoEx
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ascend_types.h"
#include "isolation_client.h"

aclError aclrtSetDevice(int32_t device);
aclError aclrtMalloc(void **p, size_t size, int policy);
aclError aclrtMallocAlign32(void **p, size_t size, int policy);
aclError aclrtMallocCached(void **p, size_t size, int policy);
aclError aclrtFree(void *p);
aclError aclrtMallocPhysical(void **handle, size_t size, const struct acl_physical_prop *prop, uint64_t flags);
aclError aclrtFreePhysical(void *handle);
aclError aclrtGetMemInfo(int attr, size_t *free, size_t *total);
aclError aclrtSynchronizeDevice(void);
aclError aclrtLaunchKernel(void *func, uint32_t blocks, const void *args, size_t size, void *stream);
aclError aclopExecuteV2(const char *op, int n_in, void *in_desc[], void *in[], int n_out, void *out_desc[],
                        void *out[], void *attr, void *stream);
aclError aclmdlExecuteAsync(uint32_t model, const void *input, void *output, void *stream);
rtError_t rtMalloc(void **p, uint64_t size, uint32_t type, uint16_t module);
rtError_t rtFree(void *p);
rtError_t rtMallocPhysical(void **handle, size_t size, struct drv_mem_prop *prop, uint64_t flags);
rtError_t rtFreePhysical(void *handle);
rtError_t rtMemGetInfoEx(int kind, size_t *free, size_t *total);
rtError_t rtKernelLaunch(const void *stub, uint32_t blocks, void *args, uint32_t size, void *sm, void *stream);
rtError_t rtKernelLaunchWithFlagV2(const void *stub, uint32_t blocks, void *args, void *sm, void *stream,
                                   uint32_t flags, const void *cfg);
rtError_t rtKernelLaunchWithHandleV2(void *handle, uint64_t tiling, uint32_t blocks, void *args, void *sm,
                                     void *stream, const void *cfg);
rtError_t rtAicpuKernelLaunchExWithArgs(uint32_t type, const char *name, uint32_t blocks, const void *args, void *sm,
                                        void *stream, uint32_t flags);
rtError_t rtModelExecute(void *model, void *stream, uint32_t flag);

enum { OK = 0, OOM = 207001, HBM = 2 };

const int client_out_of_memory = OOM;

void client_use_device(void) { client_check("aclrtSetDevice", aclrtSetDevice(0)); }

int client_alloc(uint64_t *p, size_t bytes) {
    void *d = NULL;
    int r = rtMalloc(&d, bytes, HBM, 0);
    *p = (uintptr_t)d;
    return r;
}

void client_free(uint64_t p) { client_check("rtFree", rtFree((void *)(uintptr_t)p)); }

/* ---- allocations through every counted API --------------------------------------------------------------- */

enum { A_RT, A_RT_PHYSICAL, A_ACL, A_ACL_ALIGN32, A_ACL_CACHED, A_ACL_PHYSICAL, A_KINDS };

const int client_kinds = A_KINDS;

void *client_stress_begin(void) { return NULL; }

void client_stress_end(void *context) { (void)context; }

static int allocate(int kind, size_t bytes, void **handle) {
    switch (kind) {
    case A_RT: return rtMalloc(handle, bytes, HBM, 0);
    case A_RT_PHYSICAL: {
        struct drv_mem_prop prop = {1, 0, 0, 0, 0, 0};
        return rtMallocPhysical(handle, bytes, &prop, 0);
    }
    case A_ACL: return aclrtMalloc(handle, bytes, 0);
    case A_ACL_ALIGN32: return aclrtMallocAlign32(handle, bytes, 0);
    case A_ACL_CACHED: return aclrtMallocCached(handle, bytes, 0);
    default: {
        struct acl_physical_prop prop = {0, 0, 0, {0, 1}, 0};
        return aclrtMallocPhysical(handle, bytes, &prop, 0);
    }
    }
}

int client_allocate(int kind, size_t bytes, void *context, uint64_t *handle) {
    (void)context;
    void *p = NULL;
    int r = allocate(kind, bytes, &p);
    *handle = (uintptr_t)p;
    return r;
}

void client_release(int kind, uint64_t handle) {
    void *p = (void *)(uintptr_t)handle;
    switch (kind) {
    case A_RT: client_check("rtFree", rtFree(p)); break;
    case A_RT_PHYSICAL: client_check("rtFreePhysical", rtFreePhysical(p)); break;
    case A_ACL_PHYSICAL: client_check("aclrtFreePhysical", aclrtFreePhysical(p)); break;
    default: client_check("aclrtFree", aclrtFree(p)); break;
    }
}

/* ---- launches and the benchmark -------------------------------------------------------------------------- */

static const char *const MODES[] = {"kernel", "flag", "handle", "aicpu", "model", "acl", "op", "mdl"};
#define N_MODES (sizeof MODES / sizeof *MODES)

static int launch(const char *mode, void *kernel, uint32_t blocks) {
    if (!strcmp(mode, "kernel")) return rtKernelLaunch(kernel, blocks, NULL, 0, NULL, NULL);
    if (!strcmp(mode, "flag")) return rtKernelLaunchWithFlagV2(kernel, blocks, NULL, NULL, NULL, 0, NULL);
    if (!strcmp(mode, "handle")) return rtKernelLaunchWithHandleV2(kernel, 7, blocks, NULL, NULL, NULL, NULL);
    if (!strcmp(mode, "aicpu")) return rtAicpuKernelLaunchExWithArgs(1, "fake_aicpu_op", blocks, NULL, NULL, NULL, 0);
    if (!strcmp(mode, "model")) return rtModelExecute(kernel, NULL, 0);
    if (!strcmp(mode, "acl")) return aclrtLaunchKernel(kernel, blocks, NULL, 0, NULL);
    if (!strcmp(mode, "op")) return aclopExecuteV2("FakeOp", 0, NULL, NULL, 0, NULL, NULL, NULL, NULL);
    if (!strcmp(mode, "mdl")) return aclmdlExecuteAsync((uint32_t)(uintptr_t)kernel, NULL, NULL, NULL);
    return -1;
}

int client_launch(double seconds, const char *mode, uint32_t *grids, int ngrids) {
    client_use_device();
    const char *modes[N_MODES];
    size_t nmodes = 0;
    char *list = strdup(strcmp(mode, "mixed") ? mode : "kernel,flag,handle,aicpu,model,acl,op,mdl");
    for (char *save = NULL, *m = strtok_r(list, ",", &save); m && nmodes < N_MODES; m = strtok_r(NULL, ",", &save))
        modes[nmodes++] = m;
    void *kernels[4] = {(void *)0x1000, (void *)0x2000, (void *)0x3000, (void *)0x4000};
    long launches = 0;
    double end = client_now_s() + seconds;
    while (client_now_s() < end) {
        for (int i = 0; i < 16; i++, launches++) {
            const char *m = modes[launches % (long)nmodes];
            int r = launch(m, kernels[launches % ngrids % 4], grids[launches % ngrids]);
            if (r != OK) client_die(m, r);
        }
    }
    aclrtSynchronizeDevice();
    printf("{\"launches\": %ld}\n", launches);
    return 0;
}

double client_bench_round(const char *what, long n) {
    void *p;
    size_t free, total;
    double t0 = client_now_s();
    if (!strcmp(what, "alloc")) {
        for (long i = 0; i < n; i++) {
            if (rtMalloc(&p, 1 << 20, HBM, 0) != OK) client_die("rtMalloc", 1);
            rtFree(p);
        }
    } else if (!strcmp(what, "aclalloc")) {
        for (long i = 0; i < n; i++) {
            if (aclrtMalloc(&p, 1 << 20, 0) != OK) client_die("aclrtMalloc", 1);
            aclrtFree(p);
        }
    } else if (!strcmp(what, "launch")) {
        for (long i = 0; i < n; i++) rtKernelLaunch((void *)0x1000, 1, NULL, 0, NULL, NULL);
    } else {
        for (long i = 0; i < n; i++) rtMemGetInfoEx(1, &free, &total);
    }
    return (client_now_s() - t0) / (double)n * 1e9;
}
