/*
 * launch.c: every way work reaches the device passes the core's compute limiter first: hipLaunchKernel (what
 * HIP-Clang's <<<>>> lowers to), hipExtLaunchKernel, hipLaunchCooperativeKernel, the module launches
 * (hipModuleLaunchKernel, hipModuleLaunchCooperativeKernel, hipExtModuleLaunchKernel, hipHccModuleLaunchKernel)
 * and graph launches (hipGraphLaunch). Launches from inside the HIP runtime pass straight through (runtime.c).
 *
 * The share is device time, measured: when the limiter asks for a measurement, the core's launch timer (hookkit.c)
 * brackets the launch by two HIP events on its own stream (several pairs per thread, created once per device); the
 * elapsed time between them is the device's time for that work. Without a limit the fast path is one call into the
 * core and the launch.
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "vdcu.h"

/* HIP's events, for the core's launch timer (hookkit.c). */
static int event_create(void **event) { return hami_real.hipEventCreate((hipEvent_t *)event); }
static void event_destroy(void *event) {
    if (hami_real.hipEventDestroy) hami_real.hipEventDestroy((hipEvent_t)event);
}
static int event_record(void *event, void *stream) { return hami_real.hipEventRecord((hipEvent_t)event, (hipStream_t)stream); }
static int event_query(void *event) { return hami_real.hipEventQuery((hipEvent_t)event); }
static int event_elapsed(float *ms, void *start, void *end) {
    return hami_real.hipEventElapsedTime(ms, (hipEvent_t)start, (hipEvent_t)end);
}
static int event_synchronize(void *event) { return hami_real.hipEventSynchronize((hipEvent_t)event); }

static hami_iso_events g_events = {.api = "hipEvent", .destroy = event_destroy};
static pthread_once_t g_events_once = PTHREAD_ONCE_INIT;

static void find_events(void) { /* the event table lists only the functions the runtime has */
    if (hami_real.hipEventCreate) g_events.create = event_create;
    if (hami_real.hipEventRecord) g_events.record = event_record;
    if (hami_real.hipEventQuery) g_events.query = event_query;
    if (hami_real.hipEventElapsedTime) g_events.elapsed_ms = event_elapsed;
    if (hami_real.hipEventSynchronize) g_events.synchronize = event_synchronize;
}

static const hami_iso_events *events(void) {
    pthread_once(&g_events_once, find_events);
    return &g_events;
}

#define LAUNCH(name, kernel, work, stream, call)                                                               \
    HAMI_HIP_ENTER(name);                                                                                      \
    if (hami_vdcu_from_hip(__builtin_return_address(0))) return hami_real.call;                                \
    int device = hami_vdcu_device();                                                                           \
    HAMI_ISO_LAUNCH(events(), device, (uint64_t)device, (kernel), (work), (stream), hipError_t, hami_real.call);

static inline uint64_t blocks(dim3 g) { return (uint64_t)g.x * g.y * g.z; }

HAMI_EXPORT hipError_t hipLaunchKernel(const void *function_address, dim3 numBlocks, dim3 dimBlocks, void **args,
                                       size_t sharedMemBytes, hipStream_t stream) {
    LAUNCH(hipLaunchKernel, function_address, blocks(numBlocks), stream,
           hipLaunchKernel(function_address, numBlocks, dimBlocks, args, sharedMemBytes, stream))
}

HAMI_EXPORT hipError_t hipExtLaunchKernel(const void *function_address, dim3 numBlocks, dim3 dimBlocks, void **args,
                                          size_t sharedMemBytes, hipStream_t stream, hipEvent_t startEvent,
                                          hipEvent_t stopEvent, int flags) {
    LAUNCH(hipExtLaunchKernel, function_address, blocks(numBlocks), stream,
           hipExtLaunchKernel(function_address, numBlocks, dimBlocks, args, sharedMemBytes, stream, startEvent,
                              stopEvent, flags))
}

HAMI_EXPORT hipError_t hipLaunchCooperativeKernel(const void *f, dim3 gridDim, dim3 blockDimX, void **kernelParams,
                                                  unsigned int sharedMemBytes, hipStream_t stream) {
    LAUNCH(hipLaunchCooperativeKernel, f, blocks(gridDim), stream,
           hipLaunchCooperativeKernel(f, gridDim, blockDimX, kernelParams, sharedMemBytes, stream))
}

HAMI_EXPORT hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gridDimX, unsigned int gridDimY,
                                             unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                             unsigned int blockDimZ, unsigned int sharedMemBytes, hipStream_t stream,
                                             void **kernelParams, void **extra) {
    LAUNCH(hipModuleLaunchKernel, f, (uint64_t)gridDimX * gridDimY * gridDimZ, stream,
           hipModuleLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                                 stream, kernelParams, extra))
}

HAMI_EXPORT hipError_t hipModuleLaunchCooperativeKernel(hipFunction_t f, unsigned int gridDimX, unsigned int gridDimY,
                                                        unsigned int gridDimZ, unsigned int blockDimX,
                                                        unsigned int blockDimY, unsigned int blockDimZ,
                                                        unsigned int sharedMemBytes, hipStream_t stream,
                                                        void **kernelParams) {
    LAUNCH(hipModuleLaunchCooperativeKernel, f, (uint64_t)gridDimX * gridDimY * gridDimZ, stream,
           hipModuleLaunchCooperativeKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                                            sharedMemBytes, stream, kernelParams))
}

/* The Ext/Hcc module launches take global work sizes (threads), not blocks. */
static inline uint64_t work_groups(uint32_t gx, uint32_t gy, uint32_t gz, uint32_t lx, uint32_t ly, uint32_t lz) {
    uint64_t x = lx ? (gx + lx - 1) / lx : gx, y = ly ? (gy + ly - 1) / ly : gy, z = lz ? (gz + lz - 1) / lz : gz;
    return x * y * z;
}

HAMI_EXPORT hipError_t hipExtModuleLaunchKernel(hipFunction_t f, uint32_t globalWorkSizeX, uint32_t globalWorkSizeY,
                                                uint32_t globalWorkSizeZ, uint32_t localWorkSizeX,
                                                uint32_t localWorkSizeY, uint32_t localWorkSizeZ,
                                                size_t sharedMemBytes, hipStream_t hStream, void **kernelParams,
                                                void **extra, hipEvent_t startEvent, hipEvent_t stopEvent,
                                                uint32_t flags) {
    LAUNCH(hipExtModuleLaunchKernel, f,
           work_groups(globalWorkSizeX, globalWorkSizeY, globalWorkSizeZ, localWorkSizeX, localWorkSizeY,
                       localWorkSizeZ),
           hStream,
           hipExtModuleLaunchKernel(f, globalWorkSizeX, globalWorkSizeY, globalWorkSizeZ, localWorkSizeX,
                                    localWorkSizeY, localWorkSizeZ, sharedMemBytes, hStream, kernelParams, extra,
                                    startEvent, stopEvent, flags))
}

HAMI_EXPORT hipError_t hipHccModuleLaunchKernel(hipFunction_t f, uint32_t globalWorkSizeX, uint32_t globalWorkSizeY,
                                                uint32_t globalWorkSizeZ, uint32_t localWorkSizeX,
                                                uint32_t localWorkSizeY, uint32_t localWorkSizeZ,
                                                size_t sharedMemBytes, hipStream_t hStream, void **kernelParams,
                                                void **extra, hipEvent_t startEvent, hipEvent_t stopEvent) {
    LAUNCH(hipHccModuleLaunchKernel, f,
           work_groups(globalWorkSizeX, globalWorkSizeY, globalWorkSizeZ, localWorkSizeX, localWorkSizeY,
                       localWorkSizeZ),
           hStream,
           hipHccModuleLaunchKernel(f, globalWorkSizeX, globalWorkSizeY, globalWorkSizeZ, localWorkSizeX,
                                    localWorkSizeY, localWorkSizeZ, sharedMemBytes, hStream, kernelParams, extra,
                                    startEvent, stopEvent))
}

HAMI_EXPORT hipError_t hipGraphLaunch(hipGraphExec_t graphExec, hipStream_t stream) {
    LAUNCH(hipGraphLaunch, graphExec, 1, stream, hipGraphLaunch(graphExec, stream))
}
