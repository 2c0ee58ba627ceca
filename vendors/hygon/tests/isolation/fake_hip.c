/*
 * fake_hip.c: a fake DTK HIP runtime, built by the tests as libgalaxyhip.so and loaded behind libvdcu.so exactly as
 * the real one would be. Written from HIP's documented API (hip_runtime_api.h: signatures and hipError_t codes:
 * hipErrorOutOfMemory 2, hipErrorInvalidValue 1, hipErrorInvalidDevice 101, hipErrorNotReady 600). It stands in
 * for the hardware (hami.testing's fake_device.c, configured by the FAKE_DCU_ variables):
 *   - devices: FAKE_DCU_DEVICES (default 1) of FAKE_DCU_MEMORY bytes (default 64g); device allocations (every
 *     hipMalloc* flavour and hipMemCreate on a device) are counted per device in the shared state file, running out
 *     answers hipErrorOutOfMemory; hipMallocPitch rounds the pitch up to 512 bytes;
 *   - a kernel "runs" for FAKE_DCU_KERNEL_NS plus FAKE_DCU_KERNEL_NS_PER_BLOCK x its blocks on the shared per-device
 *     timeline; events are timestamps on it; synchronization sleeps until the process's work is done;
 *   - like the real runtime, it calls its own exported functions through the global scope: hipMallocManaged is
 *     hipMalloc underneath, hipModuleLaunchKernel is hipLaunchKernel, hipMemGetInfo's free figure uses
 *     hipDeviceTotalMem (no -Bsymbolic: these calls go through the PLT and meet a preloaded library), which
 *     is what the isolation library must not count twice;
 *   - hipGetProcAddress returns its own functions by name.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fake_device.h"
#include "hip_api.h"

#define EXPORT __attribute__((visibility("default")))

typedef unsigned long long u64;

struct ihipEvent_t {
    u64 t;
    int recorded;
};

static __thread int t_device = 0;

__attribute__((constructor)) static void fake_load(void) { fake_device_load("FAKE_DCU_", 64ull << 30); }

EXPORT hipError_t hipGetDeviceCount(int *count) {
    if (!count) return hipErrorInvalidValue;
    *count = fake.devices;
    return hipSuccess;
}

EXPORT hipError_t hipSetDevice(int device) {
    if (device < 0 || device >= fake.devices) return hipErrorInvalidDevice;
    t_device = device;
    return hipSuccess;
}

EXPORT hipError_t hipGetDevice(int *device) {
    if (!device) return hipErrorInvalidValue;
    *device = t_device;
    return hipSuccess;
}

static hipError_t device_alloc(int device, void **p, size_t size) {
    if (!p) return hipErrorInvalidValue;
    if (!size) {
        *p = NULL;
        return hipSuccess;
    }
    void *b = fake_alloc(device, size, 1);
    if (!b) return hipErrorOutOfMemory;
    *p = b;
    return hipSuccess;
}

static hipError_t device_free(void *p) { return !p ? hipSuccess : fake_free(p) ? hipSuccess : hipErrorInvalidValue; }

EXPORT hipError_t hipMalloc(void **p, size_t size) { return device_alloc(t_device, p, size); }
EXPORT hipError_t hipFree(void *p) { return device_free(p); }
EXPORT hipError_t hipMallocManaged(void **p, size_t size, unsigned int flags) {
    (void)flags;
    return hipMalloc(p, size); /* through the PLT, as the runtime's internal calls may go */
}
EXPORT hipError_t hipMallocAsync(void **p, size_t size, hipStream_t stream) {
    (void)stream;
    return device_alloc(t_device, p, size);
}
EXPORT hipError_t hipMallocFromPoolAsync(void **p, size_t size, hipMemPool_t pool, hipStream_t stream) {
    (void)pool, (void)stream;
    return device_alloc(t_device, p, size);
}
EXPORT hipError_t hipFreeAsync(void *p, hipStream_t stream) {
    (void)stream;
    return device_free(p);
}
EXPORT hipError_t hipExtMallocWithFlags(void **p, size_t size, unsigned int flags) {
    (void)flags;
    return device_alloc(t_device, p, size);
}
EXPORT hipError_t hipMallocPitch(void **p, size_t *pitch, size_t width, size_t height) {
    if (!p || !pitch) return hipErrorInvalidValue;
    size_t padded = (width + 511) / 512 * 512;
    hipError_t r = device_alloc(t_device, p, padded * height);
    if (r == hipSuccess) *pitch = padded;
    return r;
}
EXPORT hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size, const hipMemAllocationProp *prop,
                               unsigned long long flags) {
    (void)flags;
    if (!handle || !prop || prop->location.id < 0 || prop->location.id >= fake.devices) return hipErrorInvalidValue;
    void *b = NULL;
    hipError_t r = device_alloc(prop->location.id, &b, size);
    if (r == hipSuccess) *handle = (hipMemGenericAllocationHandle_t)(uintptr_t)b;
    return r;
}
EXPORT hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle) { return device_free((void *)(uintptr_t)handle); }

EXPORT hipError_t hipDeviceTotalMem(size_t *bytes, hipDevice_t device) {
    if (!bytes || device < 0 || device >= fake.devices) return hipErrorInvalidValue;
    *bytes = fake.memory;
    return hipSuccess;
}

EXPORT hipError_t hipMemGetInfo(size_t *free, size_t *total) {
    if (!free || !total) return hipErrorInvalidValue;
    size_t physical = 0;
    hipError_t r = hipDeviceTotalMem(&physical, t_device); /* through the PLT */
    if (r != hipSuccess) return r;
    u64 used = fake_used(t_device);
    *total = fake.memory;
    *free = used > fake.memory ? 0 : fake.memory - used;
    return hipSuccess;
}

EXPORT hipError_t hipDeviceSynchronize(void) {
    fake_synchronize();
    return hipSuccess;
}

EXPORT hipError_t hipEventCreate(hipEvent_t *e) {
    if (!e) return hipErrorInvalidValue;
    *e = calloc(1, sizeof **e);
    return hipSuccess;
}
EXPORT hipError_t hipEventDestroy(hipEvent_t e) {
    free(e);
    return hipSuccess;
}
EXPORT hipError_t hipEventRecord(hipEvent_t e, hipStream_t stream) {
    (void)stream;
    if (!e) return hipErrorInvalidValue;
    e->t = fake_reached(t_device);
    e->recorded = 1;
    return hipSuccess;
}
EXPORT hipError_t hipEventQuery(hipEvent_t e) {
    if (!e) return hipErrorInvalidValue;
    return fake_now_ns() >= e->t ? hipSuccess : hipErrorNotReady;
}
EXPORT hipError_t hipEventSynchronize(hipEvent_t e) {
    if (!e) return hipErrorInvalidValue;
    fake_sleep_until(e->t);
    return hipSuccess;
}
EXPORT hipError_t hipEventElapsedTime(float *ms, hipEvent_t a, hipEvent_t b) {
    if (!ms || !a || !b || !a->recorded || !b->recorded) return hipErrorInvalidValue;
    if (fake_now_ns() < a->t || fake_now_ns() < b->t) return hipErrorNotReady;
    *ms = (float)(((double)b->t - (double)a->t) / 1e6);
    return hipSuccess;
}
EXPORT hipError_t hipStreamIsCapturing(hipStream_t stream, hipStreamCaptureStatus *status) {
    (void)stream;
    if (!status) return hipErrorInvalidValue;
    *status = 0;
    return hipSuccess;
}

static hipError_t run(const void *f, uint64_t blocks) {
    if (!f) return hipErrorInvalidValue;
    fake_run(t_device, fake_kernel_ns(blocks));
    return hipSuccess;
}

EXPORT hipError_t hipLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shared, hipStream_t s) {
    (void)block, (void)args, (void)shared, (void)s;
    return run(f, (uint64_t)grid.x * grid.y * grid.z);
}
EXPORT hipError_t hipExtLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shared, hipStream_t s,
                                     hipEvent_t start, hipEvent_t stop, int flags) {
    (void)start, (void)stop, (void)flags;
    return hipLaunchKernel(f, grid, block, args, shared, s);
}
EXPORT hipError_t hipLaunchCooperativeKernel(const void *f, dim3 grid, dim3 block, void **params, unsigned int shared,
                                             hipStream_t s) {
    (void)block, (void)params, (void)shared, (void)s;
    return run(f, (uint64_t)grid.x * grid.y * grid.z);
}
EXPORT hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gx, unsigned int gy, unsigned int gz,
                                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                                        hipStream_t s, void **params, void **extra) {
    (void)extra;
    dim3 grid = {gx, gy, gz}, block = {bx, by, bz};
    return hipLaunchKernel((const void *)f, grid, block, params, shared, s); /* through the PLT */
}
EXPORT hipError_t hipModuleLaunchCooperativeKernel(hipFunction_t f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                   unsigned int bx, unsigned int by, unsigned int bz,
                                                   unsigned int shared, hipStream_t s, void **params) {
    (void)bx, (void)by, (void)bz, (void)shared, (void)s, (void)params;
    return run(f, (uint64_t)gx * gy * gz);
}
static uint64_t groups(uint32_t g, uint32_t l) { return l ? (g + l - 1) / l : g; }
EXPORT hipError_t hipExtModuleLaunchKernel(hipFunction_t f, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t lx,
                                           uint32_t ly, uint32_t lz, size_t shared, hipStream_t s, void **params,
                                           void **extra, hipEvent_t start, hipEvent_t stop, uint32_t flags) {
    (void)shared, (void)s, (void)params, (void)extra, (void)start, (void)stop, (void)flags;
    return run(f, groups(gx, lx) * groups(gy, ly) * groups(gz, lz));
}
EXPORT hipError_t hipHccModuleLaunchKernel(hipFunction_t f, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t lx,
                                           uint32_t ly, uint32_t lz, size_t shared, hipStream_t s, void **params,
                                           void **extra, hipEvent_t start, hipEvent_t stop) {
    (void)shared, (void)s, (void)params, (void)extra, (void)start, (void)stop;
    return run(f, groups(gx, lx) * groups(gy, ly) * groups(gz, lz));
}
EXPORT hipError_t hipGraphLaunch(hipGraphExec_t graph, hipStream_t s) {
    (void)s;
    return run(graph, 1);
}

EXPORT hipError_t hipGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
    (void)version, (void)flags;
    if (!symbol || !pfn) return hipErrorInvalidValue;
    Dl_info info;
    void *self = dladdr((void *)&hipGetProcAddress, &info) ? dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD) : NULL;
    *pfn = self ? dlsym(self, symbol) : NULL;
    if (self) dlclose(self);
    if (status) *status = *pfn ? 0 : 1;
    return *pfn ? hipSuccess : hipErrorNotFound;
}
