/*
 * rt_api.h: a CUDA-runtime-shaped vendor runtime as the tests' fake (fake_rt.c) and client (rt_client.c) see it:
 * the vendor's names from its hami_rt_vendor.h (HAMI_RT(suffix), HAMI_RT_HAS_*), the CUDA runtime's signatures
 * with opaque handles, and the error codes every such runtime shares.
 */
#ifndef HAMI_TESTING_RT_API_H
#define HAMI_TESTING_RT_API_H

#include <stddef.h>
#include <stdint.h>

#include "hami_rt_vendor.h"

#define RT_STRING(x) #x
#define RT_NAME(suffix) HAMI_RT_PREFIX RT_STRING(suffix)

typedef int rt_error;
enum {
    RT_SUCCESS = 0,
    RT_INVALID_VALUE = 1,
    RT_OUT_OF_MEMORY = 2,
    RT_INVALID_CONFIGURATION = 9,
    RT_INVALID_DEVICE = 101,
    RT_NOT_FOUND = 500,
    RT_NOT_READY = 600,
};
typedef void *rt_stream;
typedef struct rt_event_s *rt_event;
typedef void *rt_function;
typedef unsigned long long rt_mem_handle;
typedef struct {
    uint32_t x, y, z;
} rt_dim3;
typedef struct {
    int type;
    int requestedHandleType;
    struct {
        int type;
        int id;
    } location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType, gpuDirectRDMACapable;
        unsigned short usage;
    } allocFlags;
} rt_mem_prop;
typedef struct { /* cudaLaunchConfig_t's fields, in its order */
    rt_dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    rt_stream stream;
    void *attrs;
    unsigned int numAttrs;
} rt_launch_config;

rt_error HAMI_RT(GetDeviceCount)(int *count);
rt_error HAMI_RT(SetDevice)(int device);
rt_error HAMI_RT(GetDevice)(int *device);
rt_error HAMI_RT(DeviceSynchronize)(void);
rt_error HAMI_RT(Malloc)(void **p, size_t size);
rt_error HAMI_RT(Free)(void *p);
rt_error HAMI_RT(MallocManaged)(void **p, size_t size, unsigned int flags);
rt_error HAMI_RT(MallocAsync)(void **p, size_t size, rt_stream stream);
rt_error HAMI_RT(MallocFromPoolAsync)(void **p, size_t size, void *pool, rt_stream stream);
rt_error HAMI_RT(FreeAsync)(void *p, rt_stream stream);
rt_error HAMI_RT(ExtMallocWithFlags)(void **p, size_t size, unsigned int flags);
rt_error HAMI_RT(MallocPitch)(void **p, size_t *pitch, size_t width, size_t height);
rt_error HAMI_RT(MemCreate)(rt_mem_handle *handle, size_t size, const rt_mem_prop *prop, unsigned long long flags);
rt_error HAMI_RT(MemRelease)(rt_mem_handle handle);
rt_error HAMI_RT(DeviceTotalMem)(size_t *bytes, int device);
rt_error HAMI_RT(MemGetInfo)(size_t *free, size_t *total);
rt_error HAMI_RT(EventCreate)(rt_event *e);
rt_error HAMI_RT(EventDestroy)(rt_event e);
rt_error HAMI_RT(EventRecord)(rt_event e, rt_stream stream);
rt_error HAMI_RT(EventQuery)(rt_event e);
rt_error HAMI_RT(EventSynchronize)(rt_event e);
rt_error HAMI_RT(EventElapsedTime)(float *ms, rt_event a, rt_event b);
rt_error HAMI_RT(StreamIsCapturing)(rt_stream stream, int *status);
rt_error HAMI_RT(LaunchKernel)(const void *f, rt_dim3 grid, rt_dim3 block, void **args, size_t shared, rt_stream s);
rt_error HAMI_RT(ExtLaunchKernel)(const void *f, rt_dim3 grid, rt_dim3 block, void **args, size_t shared, rt_stream s,
                                  rt_event start, rt_event stop, int flags);
rt_error HAMI_RT(LaunchKernelExC)(const rt_launch_config *config, const void *f, void **args);
rt_error HAMI_RT(LaunchCooperativeKernel)(const void *f, rt_dim3 grid, rt_dim3 block, void **params,
                                          unsigned int shared, rt_stream s);
rt_error HAMI_RT(ModuleLaunchKernel)(rt_function f, unsigned int gx, unsigned int gy, unsigned int gz,
                                     unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                                     rt_stream s, void **params, void **extra);
rt_error HAMI_RT(ModuleLaunchCooperativeKernel)(rt_function f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                unsigned int bx, unsigned int by, unsigned int bz,
                                                unsigned int shared, rt_stream s, void **params);
rt_error HAMI_RT(ExtModuleLaunchKernel)(rt_function f, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t lx,
                                        uint32_t ly, uint32_t lz, size_t shared, rt_stream s, void **params,
                                        void **extra, rt_event start, rt_event stop, uint32_t flags);
rt_error HAMI_RT(HccModuleLaunchKernel)(rt_function f, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t lx,
                                        uint32_t ly, uint32_t lz, size_t shared, rt_stream s, void **params,
                                        void **extra, rt_event start, rt_event stop);
rt_error HAMI_RT(GraphLaunch)(void *graph, rt_stream s);
rt_error HAMI_RT(GetProcAddress)(const char *symbol, void **pfn, int version, uint64_t flags, int *status);

#endif /* HAMI_TESTING_RT_API_H */
