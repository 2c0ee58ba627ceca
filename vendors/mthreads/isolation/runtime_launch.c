/*
 * runtime_launch.c: every MUSA runtime launch passes the core's compute limiter first (musaLaunchKernel, what
 * mcc's <<<>>> lowers to, musaLaunchCooperativeKernel, musaGraphLaunch), timed when the limiter asks with two of the
 * runtime's events around the launch (the core's launch timer, hookkit.c). Launches from inside the runtime pass
 * straight through (runtime.c); a stream being captured is not charged (musaStreamIsCapturing).
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "vmusa.h"

static int event_create(void **event) { return hami_musa.musaEventCreate((musaEvent_t *)event); }
static void event_destroy(void *event) {
    if (hami_musa.musaEventDestroy) hami_musa.musaEventDestroy((musaEvent_t)event);
}
static int event_record(void *event, void *stream) {
    return hami_musa.musaEventRecord((musaEvent_t)event, (musaStream_t)stream);
}
static int event_query(void *event) { return hami_musa.musaEventQuery((musaEvent_t)event); }
static int event_elapsed(float *ms, void *start, void *end) {
    return hami_musa.musaEventElapsedTime(ms, (musaEvent_t)start, (musaEvent_t)end);
}
static int event_synchronize(void *event) { return hami_musa.musaEventSynchronize((musaEvent_t)event); }
static int capturing(void *stream) {
    musaStreamCaptureStatus status = 0;
    return hami_musa.musaStreamIsCapturing((musaStream_t)stream, &status) == musaSuccess && status != 0;
}

static hami_iso_events g_events = {.api = "musaEvent", .destroy = event_destroy};
static pthread_once_t g_events_once = PTHREAD_ONCE_INIT;

static void find_events(void) { /* the table lists only the functions the runtime has */
    if (hami_musa.musaEventCreate) g_events.create = event_create;
    if (hami_musa.musaEventRecord) g_events.record = event_record;
    if (hami_musa.musaEventQuery) g_events.query = event_query;
    if (hami_musa.musaEventElapsedTime) g_events.elapsed_ms = event_elapsed;
    if (hami_musa.musaEventSynchronize) g_events.synchronize = event_synchronize;
    if (hami_musa.musaStreamIsCapturing) g_events.capturing = capturing;
}

static const hami_iso_events *events(void) {
    pthread_once(&g_events_once, find_events);
    return &g_events;
}

#define LAUNCH(name, kernel, work, stream, call)                                                               \
    HAMI_MUSA_ENTER(name);                                                                                     \
    if (hami_musa_from_runtime(__builtin_return_address(0))) return hami_musa.call;                            \
    int device = hami_musa_device();                                                                           \
    HAMI_ISO_LAUNCH(events(), device, (uint64_t)device + 1u, (kernel), (work), (stream), musaError_t,          \
                    hami_musa.call);

static inline uint64_t blocks(dim3 g) { return (uint64_t)g.x * g.y * g.z; }

HAMI_EXPORT musaError_t musaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                                         musaStream_t stream) {
    LAUNCH(musaLaunchKernel, func, blocks(gridDim), stream,
           musaLaunchKernel(func, gridDim, blockDim, args, sharedMem, stream))
}

HAMI_EXPORT musaError_t musaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                                    size_t sharedMem, musaStream_t stream) {
    LAUNCH(musaLaunchCooperativeKernel, func, blocks(gridDim), stream,
           musaLaunchCooperativeKernel(func, gridDim, blockDim, args, sharedMem, stream))
}

HAMI_EXPORT musaError_t musaGraphLaunch(musaGraphExec_t graphExec, musaStream_t stream) {
    LAUNCH(musaGraphLaunch, graphExec, 1, stream, musaGraphLaunch(graphExec, stream))
}
