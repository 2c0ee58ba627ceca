/*
 * fake_rt.c: a fake of a CUDA-runtime-shaped vendor runtime (HIP's hip*, MACA's mc*), built by a vendor's isolation
 * tests as that runtime's library (libgalaxyhip.so, libmcruntime.so) and loaded behind the vendor's isolation library
 * exactly as the real one would be. The vendor's names come from its hooks directory's hami_rt_vendor.h (HAMI_RT,
 * HAMI_RT_HAS_*: the functions its runtime has); compile with -I<that directory> and -DFAKE_RT_ENV='"FAKE_X_"' (the
 * prefix of the fake device's variables). Written from the CUDA runtime's documented shapes (signatures; error
 * codes: out of memory 2, invalid value 1, invalid configuration 9, invalid device 101, not found 500, not ready
 * 600). It stands in for the hardware (fake_device.c, configured by the FAKE_RT_ENV variables):
 *   - devices: <prefix>DEVICES (default 1) of <prefix>MEMORY bytes (default 64g); device allocations (every Malloc*
 *     flavour and MemCreate on a device) are counted per device in the shared state file, running out answers out
 *     of memory; MallocPitch rounds the pitch up to 512 bytes;
 *   - a kernel "runs" for <prefix>KERNEL_NS plus <prefix>KERNEL_NS_PER_BLOCK x its blocks on the shared per-device
 *     timeline; events are timestamps on it; synchronization sleeps until the process's work is done;
 *   - like a real runtime, it calls its own exported functions through the global scope: MallocManaged is Malloc
 *     underneath, ModuleLaunchKernel is LaunchKernel, MemGetInfo asks DeviceTotalMem where the runtime has it (built
 *     without -Bsymbolic: these calls go through the PLT and meet a preloaded library), which is what the isolation
 *     library must not count twice;
 *   - LaunchKernelExC (where the runtime has it: cudaLaunchKernelExC's shape) runs its config's grid as
 *     LaunchKernel runs its own; a NULL config is answered with invalid configuration (9), a code the isolation
 *     library never gives itself, so a test sees that the runtime answered;
 *   - GetProcAddress (where the runtime has it) returns its own functions by name.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fake_device.h"
#include "rt_api.h"

#ifndef FAKE_RT_ENV
#error "compile fake_rt.c with -DFAKE_RT_ENV='\"FAKE_X_\"', the prefix of the fake device's variables"
#endif
#define FAKE_RT(suffix) HAMI_RT(suffix)

#define EXPORT __attribute__((visibility("default")))

typedef unsigned long long u64;

struct rt_event_s {
    u64 t;
    int recorded;
};

static __thread int t_device = 0;

__attribute__((constructor)) static void fake_load(void) { fake_device_load(FAKE_RT_ENV, 64ull << 30); }

EXPORT rt_error FAKE_RT(GetDeviceCount)(int *count) {
    if (!count) return RT_INVALID_VALUE;
    *count = fake.devices;
    return RT_SUCCESS;
}

EXPORT rt_error FAKE_RT(SetDevice)(int device) {
    if (device < 0 || device >= fake.devices) return RT_INVALID_DEVICE;
    t_device = device;
    return RT_SUCCESS;
}

EXPORT rt_error FAKE_RT(GetDevice)(int *device) {
    if (!device) return RT_INVALID_VALUE;
    *device = t_device;
    return RT_SUCCESS;
}

static rt_error device_alloc(int device, void **p, size_t size) {
    if (!p) return RT_INVALID_VALUE;
    if (!size) {
        *p = NULL;
        return RT_SUCCESS;
    }
    void *b = fake_alloc(device, size, 1);
    if (!b) return RT_OUT_OF_MEMORY;
    *p = b;
    return RT_SUCCESS;
}

static rt_error device_free(void *p) { return !p ? RT_SUCCESS : fake_free(p) ? RT_SUCCESS : RT_INVALID_VALUE; }

EXPORT rt_error FAKE_RT(Malloc)(void **p, size_t size) { return device_alloc(t_device, p, size); }
EXPORT rt_error FAKE_RT(Free)(void *p) { return device_free(p); }
EXPORT rt_error FAKE_RT(MallocManaged)(void **p, size_t size, unsigned int flags) {
    (void)flags;
    return FAKE_RT(Malloc)(p, size); /* through the PLT, as the runtime's internal calls may go */
}
EXPORT rt_error FAKE_RT(MallocAsync)(void **p, size_t size, rt_stream stream) {
    (void)stream;
    return device_alloc(t_device, p, size);
}
#if defined(HAMI_RT_HAS_POOL) && HAMI_RT_HAS_POOL
EXPORT rt_error FAKE_RT(MallocFromPoolAsync)(void **p, size_t size, void * pool, rt_stream stream) {
    (void)pool, (void)stream;
    return device_alloc(t_device, p, size);
}
#endif
EXPORT rt_error FAKE_RT(FreeAsync)(void *p, rt_stream stream) {
    (void)stream;
    return device_free(p);
}
EXPORT rt_error FAKE_RT(ExtMallocWithFlags)(void **p, size_t size, unsigned int flags) {
    (void)flags;
    return device_alloc(t_device, p, size);
}
EXPORT rt_error FAKE_RT(MallocPitch)(void **p, size_t *pitch, size_t width, size_t height) {
    if (!p || !pitch) return RT_INVALID_VALUE;
    size_t padded = (width + 511) / 512 * 512;
    rt_error r = device_alloc(t_device, p, padded * height);
    if (r == RT_SUCCESS) *pitch = padded;
    return r;
}
#if defined(HAMI_RT_HAS_VMM) && HAMI_RT_HAS_VMM
EXPORT rt_error FAKE_RT(MemCreate)(rt_mem_handle *handle, size_t size, const rt_mem_prop *prop,
                               unsigned long long flags) {
    (void)flags;
    if (!handle || !prop || prop->location.id < 0 || prop->location.id >= fake.devices) return RT_INVALID_VALUE;
    void *b = NULL;
    rt_error r = device_alloc(prop->location.id, &b, size);
    if (r == RT_SUCCESS) *handle = (rt_mem_handle)(uintptr_t)b;
    return r;
}
#endif
#if defined(HAMI_RT_HAS_VMM) && HAMI_RT_HAS_VMM
EXPORT rt_error FAKE_RT(MemRelease)(rt_mem_handle handle) { return device_free((void *)(uintptr_t)handle); }
#endif

#if defined(HAMI_RT_HAS_DEVICE_TOTAL_MEM) && HAMI_RT_HAS_DEVICE_TOTAL_MEM
EXPORT rt_error FAKE_RT(DeviceTotalMem)(size_t *bytes, int device) {
    if (!bytes || device < 0 || device >= fake.devices) return RT_INVALID_VALUE;
    *bytes = fake.memory;
    return RT_SUCCESS;
}
#endif

EXPORT rt_error FAKE_RT(MemGetInfo)(size_t *free, size_t *total) {
    if (!free || !total) return RT_INVALID_VALUE;
#if defined(HAMI_RT_HAS_DEVICE_TOTAL_MEM) && HAMI_RT_HAS_DEVICE_TOTAL_MEM
    size_t physical = 0;
    rt_error r = FAKE_RT(DeviceTotalMem)(&physical, t_device); /* through the PLT */
    if (r != RT_SUCCESS) return r;
#endif
    u64 used = fake_used(t_device);
    *total = fake.memory;
    *free = used > fake.memory ? 0 : fake.memory - used;
    return RT_SUCCESS;
}

EXPORT rt_error FAKE_RT(DeviceSynchronize)(void) {
    fake_synchronize();
    return RT_SUCCESS;
}

EXPORT rt_error FAKE_RT(EventCreate)(rt_event *e) {
    if (!e) return RT_INVALID_VALUE;
    *e = calloc(1, sizeof **e);
    return RT_SUCCESS;
}
EXPORT rt_error FAKE_RT(EventDestroy)(rt_event e) {
    free(e);
    return RT_SUCCESS;
}
EXPORT rt_error FAKE_RT(EventRecord)(rt_event e, rt_stream stream) {
    (void)stream;
    if (!e) return RT_INVALID_VALUE;
    e->t = fake_reached(t_device);
    e->recorded = 1;
    return RT_SUCCESS;
}
EXPORT rt_error FAKE_RT(EventQuery)(rt_event e) {
    if (!e) return RT_INVALID_VALUE;
    return fake_now_ns() >= e->t ? RT_SUCCESS : RT_NOT_READY;
}
EXPORT rt_error FAKE_RT(EventSynchronize)(rt_event e) {
    if (!e) return RT_INVALID_VALUE;
    fake_sleep_until(e->t);
    return RT_SUCCESS;
}
EXPORT rt_error FAKE_RT(EventElapsedTime)(float *ms, rt_event a, rt_event b) {
    if (!ms || !a || !b || !a->recorded || !b->recorded) return RT_INVALID_VALUE;
    if (fake_now_ns() < a->t || fake_now_ns() < b->t) return RT_NOT_READY;
    *ms = (float)(((double)b->t - (double)a->t) / 1e6);
    return RT_SUCCESS;
}
EXPORT rt_error FAKE_RT(StreamIsCapturing)(rt_stream stream, int *status) {
    (void)stream;
    if (!status) return RT_INVALID_VALUE;
    *status = 0;
    return RT_SUCCESS;
}

static rt_error run(const void *f, uint64_t blocks) {
    if (!f) return RT_INVALID_VALUE;
    fake_run(t_device, fake_kernel_ns(blocks));
    return RT_SUCCESS;
}

EXPORT rt_error FAKE_RT(LaunchKernel)(const void *f, rt_dim3 grid, rt_dim3 block, void **args, size_t shared, rt_stream s) {
    (void)block, (void)args, (void)shared, (void)s;
    return run(f, (uint64_t)grid.x * grid.y * grid.z);
}
#if defined(HAMI_RT_HAS_LAUNCH_EXC) && HAMI_RT_HAS_LAUNCH_EXC
EXPORT rt_error FAKE_RT(LaunchKernelExC)(const rt_launch_config *config, const void *f, void **args) {
    (void)args;
    if (!config) return RT_INVALID_CONFIGURATION;
    return run(f, (uint64_t)config->gridDim.x * config->gridDim.y * config->gridDim.z);
}
#endif
#if defined(HAMI_RT_HAS_EXT_LAUNCH) && HAMI_RT_HAS_EXT_LAUNCH
EXPORT rt_error FAKE_RT(ExtLaunchKernel)(const void *f, rt_dim3 grid, rt_dim3 block, void **args, size_t shared, rt_stream s,
                                     rt_event start, rt_event stop, int flags) {
    (void)start, (void)stop, (void)flags;
    return FAKE_RT(LaunchKernel)(f, grid, block, args, shared, s);
}
#endif
EXPORT rt_error FAKE_RT(LaunchCooperativeKernel)(const void *f, rt_dim3 grid, rt_dim3 block, void **params, unsigned int shared,
                                             rt_stream s) {
    (void)block, (void)params, (void)shared, (void)s;
    return run(f, (uint64_t)grid.x * grid.y * grid.z);
}
EXPORT rt_error FAKE_RT(ModuleLaunchKernel)(rt_function f, unsigned int gx, unsigned int gy, unsigned int gz,
                                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                                        rt_stream s, void **params, void **extra) {
    (void)extra;
    rt_dim3 grid = {gx, gy, gz}, block = {bx, by, bz};
    return FAKE_RT(LaunchKernel)((const void *)f, grid, block, params, shared, s); /* through the PLT */
}
#if defined(HAMI_RT_HAS_MODULE_COOPERATIVE) && HAMI_RT_HAS_MODULE_COOPERATIVE
EXPORT rt_error FAKE_RT(ModuleLaunchCooperativeKernel)(rt_function f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                   unsigned int bx, unsigned int by, unsigned int bz,
                                                   unsigned int shared, rt_stream s, void **params) {
    (void)bx, (void)by, (void)bz, (void)shared, (void)s, (void)params;
    return run(f, (uint64_t)gx * gy * gz);
}
#endif
#if (defined(HAMI_RT_HAS_EXT_LAUNCH) && HAMI_RT_HAS_EXT_LAUNCH) || (defined(HAMI_RT_HAS_HCC) && HAMI_RT_HAS_HCC)
static uint64_t groups(uint32_t g, uint32_t l) { return l ? (g + l - 1) / l : g; }
#endif
#if defined(HAMI_RT_HAS_EXT_LAUNCH) && HAMI_RT_HAS_EXT_LAUNCH
EXPORT rt_error FAKE_RT(ExtModuleLaunchKernel)(rt_function f, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t lx,
                                           uint32_t ly, uint32_t lz, size_t shared, rt_stream s, void **params,
                                           void **extra, rt_event start, rt_event stop, uint32_t flags) {
    (void)shared, (void)s, (void)params, (void)extra, (void)start, (void)stop, (void)flags;
    return run(f, groups(gx, lx) * groups(gy, ly) * groups(gz, lz));
}
#endif
#if defined(HAMI_RT_HAS_HCC) && HAMI_RT_HAS_HCC
EXPORT rt_error FAKE_RT(HccModuleLaunchKernel)(rt_function f, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t lx,
                                           uint32_t ly, uint32_t lz, size_t shared, rt_stream s, void **params,
                                           void **extra, rt_event start, rt_event stop) {
    (void)shared, (void)s, (void)params, (void)extra, (void)start, (void)stop;
    return run(f, groups(gx, lx) * groups(gy, ly) * groups(gz, lz));
}
#endif
EXPORT rt_error FAKE_RT(GraphLaunch)(void * graph, rt_stream s) {
    (void)s;
    return run(graph, 1);
}

#if defined(HAMI_RT_HAS_PROC_ADDRESS) && HAMI_RT_HAS_PROC_ADDRESS
EXPORT rt_error FAKE_RT(GetProcAddress)(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
    (void)version, (void)flags;
    if (!symbol || !pfn) return RT_INVALID_VALUE;
    Dl_info info;
    void *self = dladdr((void *)&FAKE_RT(GetProcAddress), &info) ? dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD) : NULL;
    *pfn = self ? dlsym(self, symbol) : NULL;
    if (self) dlclose(self);
    if (status) *status = *pfn ? 0 : 1;
    return *pfn ? RT_SUCCESS : RT_NOT_FOUND;
}

#endif