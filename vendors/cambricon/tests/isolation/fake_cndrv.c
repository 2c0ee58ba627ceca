/*
 * fake_cndrv.c: a fake CNDrv, built by the tests as libcndrv.so and loaded behind libvmlu.so exactly as the real one
 * would be. Written from CNDrv's documented API (cn_api.h, CNDrv 2.15: signatures and CNresult codes:
 * CN_MEMORY_ERROR_OUT_OF_MEMORY 100100, CN_ERROR_INVALID_VALUE 100006, CN_MEMORY_ERROR_INVALID_ADDRESS 100102,
 * CN_ERROR_NOT_FOUND 100301). It stands in for the hardware (hami.testing's fake_device.c, configured by the
 * FAKE_MLU_ variables):
 *   - devices: FAKE_MLU_DEVICES (default 1) of FAKE_MLU_MEMORY bytes (default 16g); every device allocation (the
 *     cnMalloc family, cnMemAllocAsync, cnMemCreate) is counted per device in the shared state file, running out
 *     answers CN_MEMORY_ERROR_OUT_OF_MEMORY;
 *   - a kernel "runs" for FAKE_MLU_KERNEL_NS plus FAKE_MLU_KERNEL_NS_PER_BLOCK x its tasks on the per-device timeline;
 *   - like the real driver, some calls go through its own exported functions in the global scope (no -Bsymbolic):
 *     cnZmalloc is cnMalloc underneath, cnMemGetInfo's total comes from cnDeviceGetCount's device;
 *   - each device has one memory node (cnMemGetNodeInfo's node 0 is the device; another node is an invalid value);
 *     cnDeviceTotalMem takes the device's ordinal as its CNdev (what cnCtxGetDevice answers);
 *   - cnGetExportFunction returns its own functions by name.
 * The current device is the thread's context's: fake_cndrv_use_device() stands in for the context CNRT binds
 * (cnCtxSetCurrent) when cnrtSetDevice is called, and the fake_cndrv_* timeline functions give the fake CNRT the
 * device's clock for its notifiers (the fakes' own link to the one fake device; libvmlu.so never calls them).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cn_api.h"
#include "fake_device.h"

#define EXPORT __attribute__((visibility("default")))

static __thread int t_device = 0;

__attribute__((constructor)) static void fake_load(void) { fake_device_load("FAKE_MLU_", 16ull << 30); }

EXPORT void fake_cndrv_use_device(int device) { t_device = device; }
EXPORT int fake_cndrv_device_count(void) { return fake.devices; }
EXPORT uint64_t fake_cndrv_reached(void) { return fake_reached(t_device); }
EXPORT uint64_t fake_cndrv_now_ns(void) { return fake_now_ns(); }
EXPORT void fake_cndrv_sleep_until(uint64_t t) { fake_sleep_until(t); }
EXPORT void fake_cndrv_synchronize(void) { fake_synchronize(); }

EXPORT CNresult cnDeviceGetCount(int *count) {
    if (!count) return CN_ERROR_INVALID_VALUE;
    *count = fake.devices;
    return CN_SUCCESS;
}

EXPORT CNresult cnCtxGetDevice(CNdev *pdev) {
    if (!pdev) return CN_ERROR_INVALID_VALUE;
    *pdev = (CNdev)t_device;
    return CN_SUCCESS;
}

static CNresult device_alloc(CNaddr *p, uint64_t size) {
    if (!p) return CN_ERROR_INVALID_VALUE;
    if (!size) {
        *p = 0;
        return CN_SUCCESS;
    }
    void *b = fake_alloc(t_device, size, 1);
    if (!b) return CN_MEMORY_ERROR_OUT_OF_MEMORY;
    *p = (CNaddr)(uintptr_t)b;
    return CN_SUCCESS;
}

static CNresult device_free(CNaddr p) {
    return !p ? CN_SUCCESS : fake_free((void *)(uintptr_t)p) ? CN_SUCCESS : CN_MEMORY_ERROR_INVALID_ADDRESS;
}

EXPORT CNresult cnMalloc(CNaddr *p, cn_uint64_t bytes) { return device_alloc(p, bytes); }
EXPORT CNresult cnMallocSecurity(CNaddr *p, cn_uint64_t bytes) { return device_alloc(p, bytes); }
EXPORT CNresult cnMallocNode(CNaddr *p, cn_uint64_t bytes, int node) {
    (void)node;
    return device_alloc(p, bytes);
}
EXPORT CNresult cnZmalloc(CNaddr *p, cn_uint64_t bytes) {
    return cnMalloc(p, bytes); /* through the PLT, as the driver's internal calls may go */
}
EXPORT CNresult cnZmallocNode(CNaddr *p, cn_uint64_t bytes, int node) { return cnMallocNode(p, bytes, node); }
EXPORT CNresult cnMallocConstant(CNaddr *p, cn_uint64_t bytes) { return device_alloc(p, bytes); }
EXPORT CNresult cnMallocNodeConstant(CNaddr *p, cn_uint64_t bytes, int node) {
    (void)node;
    return device_alloc(p, bytes);
}
EXPORT CNresult cnMallocFrameBuffer(CNaddr *p, cn_uint64_t bytes, int node) {
    (void)node;
    return device_alloc(p, bytes);
}
EXPORT CNresult cnMallocPeerAble(CNaddr *p, cn_uint64_t bytes) { return device_alloc(p, bytes); }
EXPORT CNresult cnFree(CNaddr p) { return device_free(p); }
EXPORT CNresult cnMemAllocAsync(CNaddr *p, size_t bytes, CNqueue queue) {
    (void)queue;
    return device_alloc(p, bytes);
}
EXPORT CNresult cnMemAllocFromPoolAsync(CNaddr *p, size_t bytes, CNmemoryPool pool, CNqueue queue) {
    (void)pool, (void)queue;
    return device_alloc(p, bytes);
}
EXPORT CNresult cnMemFreeAsync(CNaddr p, CNqueue queue) {
    (void)queue;
    return device_free(p);
}
EXPORT CNresult cnMemCreate(CNmemGenericAllocationHandle *handle, cn_uint64_t size, CNmemAllocationProp *prop,
                            cn_uint64_t flags) {
    (void)prop, (void)flags;
    if (!handle) return CN_ERROR_INVALID_VALUE;
    CNaddr b = 0;
    CNresult r = device_alloc(&b, size);
    if (r == CN_SUCCESS) *handle = (CNmemGenericAllocationHandle)b;
    return r;
}
EXPORT CNresult cnMemRelease(CNmemGenericAllocationHandle handle) { return device_free((CNaddr)handle); }

EXPORT CNresult cnMemGetInfo(cn_uint64_t *free, cn_uint64_t *total) {
    if (!free || !total) return CN_ERROR_INVALID_VALUE;
    int count = 0;
    CNresult r = cnDeviceGetCount(&count); /* through the PLT */
    if (r != CN_SUCCESS || t_device >= count) return CN_ERROR_INVALID_DEVICE;
    uint64_t used = fake_used(t_device);
    *total = fake.memory;
    *free = used > fake.memory ? 0 : fake.memory - used;
    return CN_SUCCESS;
}

EXPORT CNresult cnMemGetNodeInfo(cn_uint64_t *free, cn_uint64_t *total, int node) {
    if (node != 0) return CN_ERROR_INVALID_VALUE;
    return cnMemGetInfo(free, total); /* through the PLT */
}

EXPORT CNresult cnDeviceTotalMem(cn_uint64_t *bytes, CNdev dev) {
    if (!bytes) return CN_ERROR_INVALID_VALUE;
    if (dev >= (CNdev)fake.devices) return CN_ERROR_INVALID_DEVICE;
    *bytes = fake.memory;
    return CN_SUCCESS;
}

static CNresult run(const void *kernel, uint64_t tasks) {
    if (!kernel) return CN_ERROR_INVALID_VALUE;
    fake_run(t_device, fake_kernel_ns(tasks));
    return CN_SUCCESS;
}

EXPORT CNresult cnInvokeKernel(CNkernel hkernel, unsigned int dimx, unsigned int dimy, unsigned int dimz, KernelClass c,
                               unsigned int reserve, CNqueue hqueue, void **kernelParams, void **extra) {
    (void)c, (void)reserve, (void)hqueue, (void)kernelParams, (void)extra;
    return run(hkernel, (uint64_t)dimx * dimy * dimz);
}

EXPORT CNresult cnInvokeKernelEx(const CNinvokeConfig *config, CNkernel hkernel, void **kernelParams, void **extra) {
    (void)config, (void)kernelParams, (void)extra;
    return run(hkernel, 1);
}

EXPORT CNresult cnGetExportFunction(const char *name, const void **func) {
    if (!name || !func) return CN_ERROR_INVALID_VALUE;
    Dl_info info;
    void *self = dladdr((void *)&cnGetExportFunction, &info) ? dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD) : NULL;
    *func = self ? dlsym(self, name) : NULL;
    if (self) dlclose(self);
    return *func ? CN_SUCCESS : CN_ERROR_NOT_FOUND;
}
