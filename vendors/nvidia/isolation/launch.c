/*
 * launch.c: every way work reaches the device (cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel,
 * cuGraphLaunch, and their per-thread-default-stream variants) passes the core's compute limiter first.
 *
 * When the limiter asks for a measurement, the launch is bracketed by two events on its own stream (per
 * thread, created once per context); the elapsed time between them is the device's time for that launch,
 * read later without waiting (cuEventQuery at the next measurement), or at once when the limiter has no
 * estimate yet. A stream being captured into a graph is never bracketed (that would add nodes to the user's
 * graph). Without a limit the fast path is one call into the core and the driver's launch.
 */
#define _GNU_SOURCE
#include "vgpu.h"

static _Atomic int g_timing_broken;

int hami_nv_stream_capturing(void *stream) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (!hami_real.cuStreamIsCapturing) return 0;
    if (hami_real.cuStreamIsCapturing((CUstream)stream, &status) != CUDA_SUCCESS) return 0;
    return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

static void timing_broken(const char *what, CUresult r) {
    if (!atomic_exchange(&g_timing_broken, 1))
        HAMI_LOG(HAMI_LOG_WARN, "%s failed (%d): launches cannot be timed, so the compute limit cannot be enforced",
                 what, r);
}

/* The result of the thread's launch being timed, if it is known by now. Returns 0 while it is still running. */
static int collect(struct hami_nv_thread *t) {
    CUresult r = hami_real.cuEventQuery(t->end);
    if (r == CUDA_ERROR_NOT_READY) return 0;
    t->pending = 0;
    float ms = 0;
    if (r == CUDA_SUCCESS && hami_real.cuEventElapsedTime(&ms, t->start, t->end) == CUDA_SUCCESS && ms >= 0)
        hami_iso_launch_timed(&t->launch, (uint64_t)((double)ms * 1e6));
    return 1;
}

static int have_events(struct hami_nv_thread *t) {
    (void)hami_nv_device();
    if (!t->valid) return 0; /* no current context: the launch fails anyway */
    if (t->start && t->events_context == t->context) return 1;
    if (!hami_real.cuEventCreate || !hami_real.cuEventRecord || !hami_real.cuEventQuery ||
        !hami_real.cuEventElapsedTime || !hami_real.cuEventSynchronize) {
        timing_broken("finding the event functions", CUDA_ERROR_NOT_FOUND);
        return 0;
    }
    if (t->start && hami_real.cuEventDestroy_v2) {
        hami_real.cuEventDestroy_v2(t->start);
        hami_real.cuEventDestroy_v2(t->end);
    }
    t->start = t->end = NULL;
    t->pending = 0;
    CUresult r = hami_real.cuEventCreate(&t->start, CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS) r = hami_real.cuEventCreate(&t->end, CU_EVENT_DEFAULT);
    if (r != CUDA_SUCCESS) {
        HAMI_LOG(HAMI_LOG_DEBUG, "cuEventCreate failed (%d): this launch is not timed", r);
        if (t->start && hami_real.cuEventDestroy_v2) hami_real.cuEventDestroy_v2(t->start);
        t->start = t->end = NULL;
        return 0;
    }
    t->events_context = t->context;
    return 1;
}

static inline CUstream event_stream(CUstream stream, int per_thread) {
    return (per_thread && !stream) ? CU_STREAM_PER_THREAD : stream;
}

/* Before a launch the limiter wants timed: records the start event; returns whether the launch is timed. */
static int time_begin(CUstream stream, int per_thread) {
    struct hami_nv_thread *t = &hami_nv_tls;
    if (atomic_load_explicit(&g_timing_broken, memory_order_relaxed)) return 0;
    if (t->pending && !collect(t)) return 0; /* the previous one is still running */
    CUstream s = event_stream(stream, per_thread);
    if (hami_nv_stream_capturing(s) || !have_events(t)) return 0;
    CUresult r = hami_real.cuEventRecord(t->start, s);
    if (r != CUDA_SUCCESS) {
        HAMI_LOG(HAMI_LOG_DEBUG, "cuEventRecord failed (%d): this launch is not timed", r);
        return 0;
    }
    return 1;
}

static void time_end(int timing, int decision, CUstream stream, int per_thread, CUresult launched,
                     const hami_iso_launch *launch) {
    struct hami_nv_thread *t = &hami_nv_tls;
    if (!timing || launched != CUDA_SUCCESS) return;
    if (hami_real.cuEventRecord(t->end, event_stream(stream, per_thread)) != CUDA_SUCCESS) return;
    t->launch = *launch;
    t->pending = 1;
    if (decision == HAMI_ISO_LAUNCH_TIME_NOW && hami_real.cuEventSynchronize(t->end) == CUDA_SUCCESS) collect(t);
}

#define LAUNCH(name, per_thread, kernel, work, stream, call)                                                   \
    HAMI_CUDA_ENTER(name);                                                                                     \
    hami_iso_launch launch;                                                                                    \
    int decision = hami_iso_launch_admit(hami_nv_device(), (uint64_t)(uintptr_t)(kernel), (work),              \
                                         (void *)(stream), &launch);                                           \
    if (HAMI_LIKELY(decision == HAMI_ISO_LAUNCH_GO)) return hami_real.call;                                    \
    int timing = time_begin((stream), (per_thread));                                                           \
    CUresult r = hami_real.call;                                                                               \
    time_end(timing, decision, (stream), (per_thread), r, &launch);                                            \
    return r;

#define BLOCKS(x, y, z) ((uint64_t)(x) * (uint64_t)(y) * (uint64_t)(z))

HAMI_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                    unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                    unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                                    void **extra) {
    LAUNCH(cuLaunchKernel, 0, f, BLOCKS(gridDimX, gridDimY, gridDimZ), hStream,
           cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                          kernelParams, extra))
}

HAMI_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                         unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                         unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                         void **kernelParams, void **extra) {
    LAUNCH(cuLaunchKernel_ptsz, 1, f, BLOCKS(gridDimX, gridDimY, gridDimZ), hStream,
           cuLaunchKernel_ptsz(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                               hStream, kernelParams, extra))
}

HAMI_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    if (!config) {
        HAMI_CUDA_ENTER(cuLaunchKernelEx);
        return hami_real.cuLaunchKernelEx(config, f, kernelParams, extra);
    }
    LAUNCH(cuLaunchKernelEx, 0, f, BLOCKS(config->gridDimX, config->gridDimY, config->gridDimZ), config->hStream,
           cuLaunchKernelEx(config, f, kernelParams, extra))
}

HAMI_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                           void **extra) {
    if (!config) {
        HAMI_CUDA_ENTER(cuLaunchKernelEx_ptsz);
        return hami_real.cuLaunchKernelEx_ptsz(config, f, kernelParams, extra);
    }
    LAUNCH(cuLaunchKernelEx_ptsz, 1, f, BLOCKS(config->gridDimX, config->gridDimY, config->gridDimZ),
           config->hStream, cuLaunchKernelEx_ptsz(config, f, kernelParams, extra))
}

HAMI_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                               unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                               unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                               void **kernelParams) {
    LAUNCH(cuLaunchCooperativeKernel, 0, f, BLOCKS(gridDimX, gridDimY, gridDimZ), hStream,
           cuLaunchCooperativeKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                                     hStream, kernelParams))
}

HAMI_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                                    unsigned int gridDimZ, unsigned int blockDimX,
                                                    unsigned int blockDimY, unsigned int blockDimZ,
                                                    unsigned int sharedMemBytes, CUstream hStream,
                                                    void **kernelParams) {
    LAUNCH(cuLaunchCooperativeKernel_ptsz, 1, f, BLOCKS(gridDimX, gridDimY, gridDimZ), hStream,
           cuLaunchCooperativeKernel_ptsz(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                                          sharedMemBytes, hStream, kernelParams))
}

HAMI_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    LAUNCH(cuGraphLaunch, 0, hGraphExec, 1, hStream, cuGraphLaunch(hGraphExec, hStream))
}

HAMI_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    LAUNCH(cuGraphLaunch_ptsz, 1, hGraphExec, 1, hStream, cuGraphLaunch_ptsz(hGraphExec, hStream))
}
