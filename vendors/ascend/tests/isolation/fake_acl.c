/*
 * fake_acl.c: a fake AscendCL, built by the tests as libascendcl.so (linked against the fake libruntime.so) and
 * layered on the runtime the way the real one is: its functions reach the runtime's through the PLT, so a
 * preloaded libvnpu.so intercepts those runtime calls whether the application calls AscendCL directly, looks its
 * functions up with dlsym on a dlopen(RTLD_LOCAL) handle (as PyTorch's Ascend backend does), or calls the runtime
 * itself.
 *   - aclrtMalloc aligns the size to 32 bytes and pads 32 more before calling rtMalloc (the documented padding),
 *     aclrtMallocAlign32 only aligns, aclrtMallocCached calls aclrtMalloc (through the PLT, as an exported function
 *     of the same library is called), aclrtMallocHost asks rtMalloc for host memory;
 *   - aclrtMallocPhysical translates its property into the runtime's and calls rtMallocPhysical;
 *   - aclrtGetMemInfo calls rtMemGetInfoEx with the same memory kind;
 *   - aclopExecuteV2 launches one kernel with rtKernelLaunchWithFlagV2, aclmdlExecute(Async) runs rtModelExecute
 *     (the synchronous one then waits for the stream);
 *   - aclrtLaunchKernel and aclrtLaunchKernelWithConfig reach the device through rtLaunchKernelByFuncHandle, an entry
 *     point libvnpu.so does not hook; with FAKE_ACL_PRIVATE_MALLOC=1 the allocation functions use
 *     fake_rt_malloc_private / fake_rt_free_private likewise: the AscendCL calls that do not reach a hooked runtime
 *     function, which libvnpu.so must count at the AscendCL layer.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ascend_types.h"

#define EXPORT __attribute__((visibility("default")))

rtError_t rtSetDevice(int32_t device);
rtError_t rtGetDevice(int32_t *device);
rtError_t rtGetDeviceCount(int32_t *count);
rtError_t rtDeviceReset(int32_t device);
rtError_t rtCtxCreate(void **ctx, uint32_t flags, int32_t device);
rtError_t rtCtxSetCurrent(void *ctx);
rtError_t rtMalloc(void **p, uint64_t size, uint32_t type, uint16_t module);
rtError_t rtFree(void *p);
rtError_t fake_rt_malloc_private(void **p, uint64_t size);
rtError_t fake_rt_free_private(void *p);
rtError_t rtMallocPhysical(void **handle, size_t size, struct drv_mem_prop *prop, uint64_t flags);
rtError_t rtFreePhysical(void *handle);
rtError_t rtMemGetInfoEx(int kind, size_t *free, size_t *total);
rtError_t rtStreamSynchronize(void *stream);
rtError_t rtDeviceSynchronize(void);
rtError_t rtKernelLaunchWithFlagV2(const void *stub, uint32_t blocks, void *args, void *sm, void *stream,
                                   uint32_t flags, const void *cfg);
rtError_t rtModelExecute(void *model, void *stream, uint32_t flag);
rtError_t rtLaunchKernelByFuncHandle(void *func, uint32_t blocks, void *stream);

enum { RT_MEMORY_HBM = 0x2, RT_MEMORY_HOST = 0x81, ACL_ERROR_INVALID_PARAM = 100000 };

static int g_private = -1;

static int private_malloc(void) {
    if (g_private < 0) {
        const char *v = getenv("FAKE_ACL_PRIVATE_MALLOC");
        g_private = v && !strcmp(v, "1");
    }
    return g_private;
}

static inline uint64_t align32(uint64_t size) { return (size + 31u) & ~(uint64_t)31u; }

EXPORT aclError aclInit(const char *config) {
    (void)config;
    return 0;
}

EXPORT aclError aclFinalize(void) { return 0; }

EXPORT aclError aclrtSetDevice(int32_t device) { return rtSetDevice(device); }
EXPORT aclError aclrtGetDevice(int32_t *device) { return rtGetDevice(device); }
EXPORT aclError aclrtGetDeviceCount(uint32_t *count) { return rtGetDeviceCount((int32_t *)count); }
EXPORT aclError aclrtResetDevice(int32_t device) { return rtDeviceReset(device); }
EXPORT aclError aclrtCreateContext(void **ctx, int32_t device) { return rtCtxCreate(ctx, 0, device); }
EXPORT aclError aclrtSetCurrentContext(void *ctx) { return rtCtxSetCurrent(ctx); }

static aclError device_malloc(void **p, uint64_t size) {
    if (!p || !size) return ACL_ERROR_INVALID_PARAM;
    return private_malloc() ? fake_rt_malloc_private(p, size) : rtMalloc(p, size, RT_MEMORY_HBM, 0);
}

EXPORT aclError aclrtMalloc(void **p, size_t size, int policy) {
    (void)policy;
    return device_malloc(p, align32(size) + 32u);
}

EXPORT aclError aclrtMallocAlign32(void **p, size_t size, int policy) {
    (void)policy;
    return device_malloc(p, align32(size));
}

EXPORT aclError aclrtMallocCached(void **p, size_t size, int policy) { return aclrtMalloc(p, size, policy); }

EXPORT aclError aclrtFree(void *p) { return private_malloc() ? fake_rt_free_private(p) : rtFree(p); }

EXPORT aclError aclrtMallocHost(void **p, size_t size) { return rtMalloc(p, size, RT_MEMORY_HOST, 0); }

EXPORT aclError aclrtFreeHost(void *p) { return rtFree(p); }

EXPORT aclError aclrtMallocPhysical(void **handle, size_t size, const struct acl_physical_prop *prop, uint64_t flags) {
    if (!prop) return ACL_ERROR_INVALID_PARAM;
    struct drv_mem_prop rt = {prop->location.type == 1 ? 1u : 0u, prop->location.id, 0, 0, 0, 0};
    return rtMallocPhysical(handle, size, &rt, flags);
}

EXPORT aclError aclrtFreePhysical(void *handle) { return rtFreePhysical(handle); }

EXPORT aclError aclrtGetMemInfo(int attr, size_t *free, size_t *total) { return rtMemGetInfoEx(attr, free, total); }

EXPORT aclError aclrtSynchronizeStream(void *stream) { return rtStreamSynchronize(stream); }

EXPORT aclError aclrtSynchronizeDevice(void) { return rtDeviceSynchronize(); }

EXPORT aclError aclrtLaunchKernel(void *func, uint32_t blocks, const void *args, size_t size, void *stream) {
    (void)args, (void)size;
    return rtLaunchKernelByFuncHandle(func, blocks, stream);
}

EXPORT aclError aclrtLaunchKernelWithConfig(void *func, uint32_t blocks, void *stream, void *cfg, void *args,
                                            void *reserve) {
    (void)cfg, (void)args, (void)reserve;
    return rtLaunchKernelByFuncHandle(func, blocks, stream);
}

EXPORT aclError aclopExecuteV2(const char *op, int n_in, void *in_desc[], void *in[], int n_out, void *out_desc[],
                               void *out[], void *attr, void *stream) {
    (void)n_in, (void)in_desc, (void)in, (void)n_out, (void)out_desc, (void)out, (void)attr;
    if (!op) return ACL_ERROR_INVALID_PARAM;
    return rtKernelLaunchWithFlagV2(op, 1, NULL, NULL, stream, 0, NULL);
}

EXPORT aclError aclmdlExecuteAsync(uint32_t model, const void *input, void *output, void *stream) {
    (void)input, (void)output;
    return rtModelExecute((void *)(uintptr_t)(model + 1u), stream, 0);
}

EXPORT aclError aclmdlExecute(uint32_t model, const void *input, void *output) {
    aclError r = aclmdlExecuteAsync(model, input, output, NULL);
    return r ? r : rtStreamSynchronize(NULL);
}
