/*
 * fake_runtime.c: a fake Ascend runtime, built by the tests as libruntime.so and loaded behind libvnpu.so exactly as
 * the real one would be (the fake AscendCL, fake_acl.c, calls into it as the real libascendcl.so calls the real
 * runtime). It stands in for the hardware (hami.testing's fake_device.c, configured by the FAKE_NPU_ variables), so
 * that what the isolation library claims can be checked against what "really" happened:
 *   - devices: FAKE_NPU_DEVICES (default 1), each of FAKE_NPU_MEMORY bytes (k/m/g suffix; default 32g);
 *   - device allocations (rtMalloc of a device type, rtMallocPhysical on the device side) are backed by host memory
 *     (FAKE_NPU_NO_BACKING=1 keeps only a small header, for the benchmark) and counted per device in the shared
 *     state file FAKE_NPU_STATE: what is really allocated now, and its peak, across every process; running out
 *     answers ACL_ERROR_RT_MEMORY_ALLOCATION (207001), as the real runtime does;
 *   - a kernel "runs" for FAKE_NPU_KERNEL_NS plus FAKE_NPU_KERNEL_NS_PER_BLOCK x blockDim (a model for
 *     FAKE_NPU_MODEL_NS, default the kernel time) on a per-device timeline shared by all processes (the device runs
 *     one thing at a time, in the order it was queued), credited to FAKE_NPU_TAG (0-7) of the launching process; a
 *     launch waits, before it is queued, while the process has more than FAKE_NPU_QUEUE_NS (default 20 ms) of its
 *     own work queued;
 *   - events are timestamps on that timeline; synchronization sleeps until the process's work is done;
 *   - rtLaunchKernelByFuncHandle and fake_rt_malloc_private / fake_rt_free_private are entry points libvnpu.so does
 *     not hook (what a newer AscendCL may call instead of the hooked ones).
 * On a normal exit it frees what the process still holds (the real driver frees a dead process's memory).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>

#include "ascend_types.h"
#include "fake_device.h"

#define EXPORT __attribute__((visibility("default")))

typedef unsigned long long u64;

enum {
    OK = 0,
    PARAM_INVALID = 107000,
    DEVICE_INVALID = 107001,
    CONTEXT_NULL = 107002,
    MEMORY_ALLOCATION = 207001,
    MEMORY_FREE = 207002,
    EVENT_NOT_COMPLETE = 507017,
};

struct event {
    u64 t;
    int recorded;
};

/* ---- configuration and state ---------------------------------------------------------------------------- */

static u64 g_model_ns;
static __thread int t_device = -1;

__attribute__((constructor)) static void fake_load(void) {
    fake_device_load("FAKE_NPU_", 32ull << 30);
    g_model_ns = fake_env("MODEL_NS", fake_kernel_ns(0));
}

static rtError_t free_block(void *p) { return !p ? PARAM_INVALID : fake_free(p) ? OK : MEMORY_FREE; }

/* ---- devices -------------------------------------------------------------------------------------------- */

EXPORT rtError_t rtGetDeviceCount(int32_t *count) {
    if (!count) return PARAM_INVALID;
    *count = fake.devices;
    return OK;
}

EXPORT rtError_t rtSetDevice(int32_t device) {
    if (device < 0 || device >= fake.devices) return DEVICE_INVALID;
    t_device = device;
    return OK;
}

EXPORT rtError_t rtGetDevice(int32_t *device) {
    if (!device) return PARAM_INVALID;
    if (t_device < 0) return CONTEXT_NULL;
    *device = t_device;
    return OK;
}

/* A "context" is its device plus one, as a pointer. */
EXPORT rtError_t rtCtxCreate(void **ctx, uint32_t flags, int32_t device) {
    (void)flags;
    if (!ctx) return PARAM_INVALID;
    if (device < 0 || device >= fake.devices) return DEVICE_INVALID;
    *ctx = (void *)(uintptr_t)(device + 1);
    t_device = device;
    return OK;
}

EXPORT rtError_t rtCtxSetCurrent(void *ctx) {
    intptr_t device = (intptr_t)ctx - 1;
    if (device < 0 || device >= fake.devices) return CONTEXT_NULL;
    t_device = (int)device;
    return OK;
}

EXPORT rtError_t rtDeviceReset(int32_t device) {
    if (device < 0 || device >= fake.devices) return DEVICE_INVALID;
    fake_reset_device(device); /* everything of the device in this process is gone */
    if (t_device == device) t_device = -1;
    return OK;
}

/* ---- memory API ----------------------------------------------------------------------------------------- */

EXPORT rtError_t rtMalloc(void **p, uint64_t size, uint32_t type, uint16_t module) {
    (void)module;
    if (!p || !size) return PARAM_INVALID;
    int host = (type & 0x80u) != 0;
    if (!host && t_device < 0) return CONTEXT_NULL;
    void *b = fake_alloc(host ? 0 : t_device, size, !host);
    if (!b) return MEMORY_ALLOCATION;
    *p = b;
    return OK;
}

EXPORT rtError_t rtFree(void *p) { return free_block(p); }

EXPORT rtError_t fake_rt_malloc_private(void **p, uint64_t size) { return rtMalloc(p, size, 2, 0); }

EXPORT rtError_t fake_rt_free_private(void *p) { return free_block(p); }

EXPORT rtError_t rtMallocPhysical(void **handle, size_t size, struct drv_mem_prop *prop, uint64_t flags) {
    (void)flags;
    if (!handle || !prop || !size) return PARAM_INVALID;
    int device_side = prop->side == 1;
    if (device_side && prop->devid >= (uint32_t)fake.devices) return DEVICE_INVALID;
    void *b = fake_alloc(device_side ? (int)prop->devid : 0, size, device_side);
    if (!b) return MEMORY_ALLOCATION;
    *handle = b;
    return OK;
}

EXPORT rtError_t rtFreePhysical(void *handle) { return free_block(handle); }

EXPORT rtError_t rtMemGetInfoEx(int kind, size_t *free, size_t *total) {
    (void)kind;
    if (t_device < 0) return CONTEXT_NULL;
    if (!free || !total) return PARAM_INVALID;
    u64 used = fake_used(t_device);
    *total = fake.memory;
    *free = used > fake.memory ? 0 : fake.memory - used;
    return OK;
}

EXPORT rtError_t rtMemGetInfo(size_t *free, size_t *total) { return rtMemGetInfoEx(1, free, total); }

/* ---- streams, events, launches -------------------------------------------------------------------------- */

EXPORT rtError_t rtStreamSynchronize(void *stream) {
    (void)stream;
    fake_synchronize();
    return OK;
}

EXPORT rtError_t rtDeviceSynchronize(void) {
    fake_synchronize();
    return OK;
}

EXPORT rtError_t rtEventCreate(struct event **e) {
    if (!e) return PARAM_INVALID;
    *e = calloc(1, sizeof **e);
    return OK;
}

EXPORT rtError_t rtEventDestroy(struct event *e) {
    free(e);
    return OK;
}

EXPORT rtError_t rtEventRecord(struct event *e, void *stream) {
    (void)stream;
    if (t_device < 0) return CONTEXT_NULL;
    if (!e) return PARAM_INVALID;
    e->t = fake_reached(t_device);
    e->recorded = 1;
    return OK;
}

EXPORT rtError_t rtEventQuery(struct event *e) {
    if (!e) return PARAM_INVALID;
    return fake_now_ns() >= e->t ? OK : EVENT_NOT_COMPLETE;
}

EXPORT rtError_t rtEventSynchronize(struct event *e) {
    if (!e) return PARAM_INVALID;
    fake_sleep_until(e->t);
    return OK;
}

EXPORT rtError_t rtEventElapsedTime(float *ms, struct event *a, struct event *b) {
    if (!ms || !a || !b || !a->recorded || !b->recorded) return PARAM_INVALID;
    if (fake_now_ns() < a->t || fake_now_ns() < b->t) return EVENT_NOT_COMPLETE;
    *ms = (float)(((double)b->t - (double)a->t) / 1e6);
    return OK;
}

static rtError_t run(u64 duration) {
    if (t_device < 0) return CONTEXT_NULL;
    fake_run(t_device, duration);
    return OK;
}

EXPORT rtError_t rtKernelLaunch(const void *stub, uint32_t blocks, void *args, uint32_t size, void *sm, void *stream) {
    (void)args, (void)size, (void)sm, (void)stream;
    if (!stub) return PARAM_INVALID;
    return run(fake_kernel_ns(blocks));
}

EXPORT rtError_t rtKernelLaunchWithFlagV2(const void *stub, uint32_t blocks, void *args, void *sm, void *stream,
                                          uint32_t flags, const void *cfg) {
    (void)args, (void)sm, (void)stream, (void)flags, (void)cfg;
    if (!stub) return PARAM_INVALID;
    return run(fake_kernel_ns(blocks));
}

EXPORT rtError_t rtKernelLaunchWithHandleV2(void *handle, uint64_t tiling, uint32_t blocks, void *args, void *sm,
                                            void *stream, const void *cfg) {
    (void)tiling, (void)args, (void)sm, (void)stream, (void)cfg;
    if (!handle) return PARAM_INVALID;
    return run(fake_kernel_ns(blocks));
}

EXPORT rtError_t rtAicpuKernelLaunchExWithArgs(uint32_t type, const char *name, uint32_t blocks, const void *args,
                                               void *sm, void *stream, uint32_t flags) {
    (void)type, (void)args, (void)sm, (void)stream, (void)flags;
    if (!name) return PARAM_INVALID;
    return run(fake_kernel_ns(blocks));
}

EXPORT rtError_t rtAicpuKernelLaunchWithFlag(const void *names, uint32_t blocks, const void *args, void *sm,
                                             void *stream, uint32_t flags) {
    (void)args, (void)sm, (void)stream, (void)flags;
    if (!names) return PARAM_INVALID;
    return run(fake_kernel_ns(blocks));
}

EXPORT rtError_t rtModelExecute(void *model, void *stream, uint32_t flag) {
    (void)stream, (void)flag;
    if (!model) return PARAM_INVALID;
    return run(g_model_ns);
}

/* A newer launch entry point libvnpu.so does not hook: what the fake AscendCL's aclrtLaunchKernel uses. */
EXPORT rtError_t rtLaunchKernelByFuncHandle(void *func, uint32_t blocks, void *stream) {
    (void)stream;
    if (!func) return PARAM_INVALID;
    return run(fake_kernel_ns(blocks));
}
