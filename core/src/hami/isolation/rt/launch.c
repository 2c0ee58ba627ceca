/*
 * launch.c: every way work reaches the device passes the core's compute limiter first: LaunchKernel (what the
 * compiler's <<<>>> lowers to), LaunchCooperativeKernel, the module (driver-style) launches ModuleLaunchKernel and,
 * where the runtime has them, ModuleLaunchCooperativeKernel, ExtLaunchKernel, ExtModuleLaunchKernel and
 * HccModuleLaunchKernel, the launch-config launch LaunchKernelExC (what CUDA's cudaLaunchKernelEx template lowers
 * to), and graph launches (GraphLaunch). Launches from inside the runtime pass straight through (runtime.c).
 *
 * The share is device time, measured: when the limiter asks for a measurement, the core's launch timer (hookkit.c)
 * brackets the launch by two of the runtime's events on its own stream (several pairs per thread, created once per
 * device); the elapsed time between them is the device's time for that work. Without a limit the fast path is one
 * call into the core and the launch.
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "hami_rt.h"

/* The runtime's events, for the core's launch timer (hookkit.c). */
static int event_create(void **event) { return hami_rt_fn.EventCreate((hami_rt_event *)event); }
static void event_destroy(void *event) {
    if (hami_rt_fn.EventDestroy) hami_rt_fn.EventDestroy(event);
}
static int event_record(void *event, void *stream) { return hami_rt_fn.EventRecord(event, stream); }
static int event_query(void *event) { return hami_rt_fn.EventQuery(event); }
static int event_elapsed(float *ms, void *start, void *end) { return hami_rt_fn.EventElapsedTime(ms, start, end); }
static int event_synchronize(void *event) { return hami_rt_fn.EventSynchronize(event); }
static int capturing(void *stream) {
    int status = 0;
    return hami_rt_fn.StreamIsCapturing(stream, &status) == HAMI_RT_SUCCESS && status != 0;
}

static hami_iso_events g_events = {.api = HAMI_RT_PREFIX "Event", .destroy = event_destroy};
static pthread_once_t g_events_once = PTHREAD_ONCE_INIT;

static void find_events(void) { /* the event table lists only the functions the runtime has */
    if (hami_rt_fn.EventCreate) g_events.create = event_create;
    if (hami_rt_fn.EventRecord) g_events.record = event_record;
    if (hami_rt_fn.EventQuery) g_events.query = event_query;
    if (hami_rt_fn.EventElapsedTime) g_events.elapsed_ms = event_elapsed;
    if (hami_rt_fn.EventSynchronize) g_events.synchronize = event_synchronize;
    if (hami_rt_fn.StreamIsCapturing) g_events.capturing = capturing; /* no timing event added to a graph */
}

static const hami_iso_events *events(void) {
    pthread_once(&g_events_once, find_events);
    return &g_events;
}

#define LAUNCH(name, kernel, work, stream, call)                                                               \
    HAMI_RT_ENTER(name);                                                                                       \
    if (hami_rt_from_runtime(__builtin_return_address(0))) return hami_rt_fn.call;                              \
    int device = hami_rt_device();                                                                             \
    HAMI_ISO_LAUNCH(events(), device, (uint64_t)device, (kernel), (work), (stream), hami_rt_error, hami_rt_fn.call);

static inline uint64_t blocks(hami_rt_dim3 g) { return (uint64_t)g.x * g.y * g.z; }

HAMI_EXPORT hami_rt_error HAMI_RT(LaunchKernel)(const void *function_address, hami_rt_dim3 numBlocks,
                                                hami_rt_dim3 dimBlocks, void **args, size_t sharedMemBytes,
                                                hami_rt_stream stream) {
    LAUNCH(LaunchKernel, function_address, blocks(numBlocks), stream,
           LaunchKernel(function_address, numBlocks, dimBlocks, args, sharedMemBytes, stream))
}

#if defined(HAMI_RT_HAS_LAUNCH_EXC) && HAMI_RT_HAS_LAUNCH_EXC
/* CUDA's cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args), the signature and the
 * struct (hami_rt.h: hami_rt_launch_config) taken by parity: the grid and the stream are read from the config. The
 * runtime is handed a copy read once (so the struct must be the runtime's to its last field, as parity assumes):
 * what the limiter admitted and timed (its blocks, its stream) is what runs, whatever another thread of the process
 * writes into the caller's struct meanwhile. A NULL config describes no work: it goes straight to the runtime,
 * which answers its own error. */
HAMI_EXPORT hami_rt_error HAMI_RT(LaunchKernelExC)(const hami_rt_launch_config *config, const void *func, void **args) {
    if (HAMI_UNLIKELY(!config)) {
        HAMI_RT_ENTER(LaunchKernelExC);
        return hami_rt_fn.LaunchKernelExC(config, func, args);
    }
    const hami_rt_launch_config copy = *config;
    LAUNCH(LaunchKernelExC, func, blocks(copy.gridDim), copy.stream, LaunchKernelExC(&copy, func, args))
}
#endif

HAMI_EXPORT hami_rt_error HAMI_RT(LaunchCooperativeKernel)(const void *f, hami_rt_dim3 gridDim, hami_rt_dim3 blockDimX,
                                                           void **kernelParams, unsigned int sharedMemBytes,
                                                           hami_rt_stream stream) {
    LAUNCH(LaunchCooperativeKernel, f, blocks(gridDim), stream,
           LaunchCooperativeKernel(f, gridDim, blockDimX, kernelParams, sharedMemBytes, stream))
}

#if HAMI_RT_HAS_HIP_EXTRAS
HAMI_EXPORT hami_rt_error HAMI_RT(ModuleLaunchKernel)(hami_rt_function f, unsigned int gridDimX, unsigned int gridDimY,
                                                      unsigned int gridDimZ, unsigned int blockDimX,
                                                      unsigned int blockDimY, unsigned int blockDimZ,
                                                      unsigned int sharedMemBytes, hami_rt_stream stream,
                                                      void **kernelParams, void **extra) {
    LAUNCH(ModuleLaunchKernel, f, (uint64_t)gridDimX * gridDimY * gridDimZ, stream,
           ModuleLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, stream,
                              kernelParams, extra))
}
#endif

HAMI_EXPORT hami_rt_error HAMI_RT(GraphLaunch)(void *graphExec, hami_rt_stream stream) {
    LAUNCH(GraphLaunch, graphExec, 1, stream, GraphLaunch(graphExec, stream))
}

#if defined(HAMI_RT_HAS_MODULE_COOPERATIVE) && HAMI_RT_HAS_MODULE_COOPERATIVE
HAMI_EXPORT hami_rt_error HAMI_RT(ModuleLaunchCooperativeKernel)(hami_rt_function f, unsigned int gridDimX,
                                                                 unsigned int gridDimY, unsigned int gridDimZ,
                                                                 unsigned int blockDimX, unsigned int blockDimY,
                                                                 unsigned int blockDimZ, unsigned int sharedMemBytes,
                                                                 hami_rt_stream stream, void **kernelParams) {
    LAUNCH(ModuleLaunchCooperativeKernel, f, (uint64_t)gridDimX * gridDimY * gridDimZ, stream,
           ModuleLaunchCooperativeKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                                         sharedMemBytes, stream, kernelParams))
}
#endif

#if (defined(HAMI_RT_HAS_EXT_LAUNCH) && HAMI_RT_HAS_EXT_LAUNCH) || (defined(HAMI_RT_HAS_HCC) && HAMI_RT_HAS_HCC)
/* The Ext/Hcc module launches take global work sizes (threads), not blocks. */
static inline uint64_t work_groups(uint32_t gx, uint32_t gy, uint32_t gz, uint32_t lx, uint32_t ly, uint32_t lz) {
    uint64_t x = lx ? (gx + lx - 1) / lx : gx, y = ly ? (gy + ly - 1) / ly : gy, z = lz ? (gz + lz - 1) / lz : gz;
    return x * y * z;
}
#endif

#if defined(HAMI_RT_HAS_EXT_LAUNCH) && HAMI_RT_HAS_EXT_LAUNCH
HAMI_EXPORT hami_rt_error HAMI_RT(ExtLaunchKernel)(const void *function_address, hami_rt_dim3 numBlocks,
                                                   hami_rt_dim3 dimBlocks, void **args, size_t sharedMemBytes,
                                                   hami_rt_stream stream, hami_rt_event startEvent,
                                                   hami_rt_event stopEvent, int flags) {
    LAUNCH(ExtLaunchKernel, function_address, blocks(numBlocks), stream,
           ExtLaunchKernel(function_address, numBlocks, dimBlocks, args, sharedMemBytes, stream, startEvent,
                           stopEvent, flags))
}

HAMI_EXPORT hami_rt_error HAMI_RT(ExtModuleLaunchKernel)(hami_rt_function f, uint32_t globalWorkSizeX,
                                                         uint32_t globalWorkSizeY, uint32_t globalWorkSizeZ,
                                                         uint32_t localWorkSizeX, uint32_t localWorkSizeY,
                                                         uint32_t localWorkSizeZ, size_t sharedMemBytes,
                                                         hami_rt_stream hStream, void **kernelParams, void **extra,
                                                         hami_rt_event startEvent, hami_rt_event stopEvent,
                                                         uint32_t flags) {
    LAUNCH(ExtModuleLaunchKernel, f,
           work_groups(globalWorkSizeX, globalWorkSizeY, globalWorkSizeZ, localWorkSizeX, localWorkSizeY,
                       localWorkSizeZ),
           hStream,
           ExtModuleLaunchKernel(f, globalWorkSizeX, globalWorkSizeY, globalWorkSizeZ, localWorkSizeX, localWorkSizeY,
                                 localWorkSizeZ, sharedMemBytes, hStream, kernelParams, extra, startEvent, stopEvent,
                                 flags))
}
#endif

#if defined(HAMI_RT_HAS_HCC) && HAMI_RT_HAS_HCC
HAMI_EXPORT hami_rt_error HAMI_RT(HccModuleLaunchKernel)(hami_rt_function f, uint32_t globalWorkSizeX,
                                                         uint32_t globalWorkSizeY, uint32_t globalWorkSizeZ,
                                                         uint32_t localWorkSizeX, uint32_t localWorkSizeY,
                                                         uint32_t localWorkSizeZ, size_t sharedMemBytes,
                                                         hami_rt_stream hStream, void **kernelParams, void **extra,
                                                         hami_rt_event startEvent, hami_rt_event stopEvent) {
    LAUNCH(HccModuleLaunchKernel, f,
           work_groups(globalWorkSizeX, globalWorkSizeY, globalWorkSizeZ, localWorkSizeX, localWorkSizeY,
                       localWorkSizeZ),
           hStream,
           HccModuleLaunchKernel(f, globalWorkSizeX, globalWorkSizeY, globalWorkSizeZ, localWorkSizeX, localWorkSizeY,
                                 localWorkSizeZ, sharedMemBytes, hStream, kernelParams, extra, startEvent, stopEvent))
}
#endif
