/*
 * launch.c: every way work reaches the device passes the core's compute limiter first: hipLaunchKernel (what
 * HIP-Clang's <<<>>> lowers to), hipExtLaunchKernel, hipLaunchCooperativeKernel, the module launches
 * (hipModuleLaunchKernel, hipModuleLaunchCooperativeKernel, hipExtModuleLaunchKernel, hipHccModuleLaunchKernel)
 * and graph launches (hipGraphLaunch). Launches from inside the HIP runtime pass straight through (runtime.c).
 *
 * The share is device time, measured: when the limiter asks for a measurement, the launch is bracketed by two HIP
 * events on its own stream; the elapsed time between them is the device's time for that work, read later without
 * waiting (hipEventQuery at a later measurement), or at once when the limiter has no estimate yet. Each thread has
 * several event pairs (created once per device), so a measurement waiting behind a deep queue does not keep the
 * next kinds of work from being measured. Without a limit the fast path is one call into the core and the launch.
 */
#define _GNU_SOURCE
#include "vdcu.h"

static _Atomic int g_timing_broken;

static void timing_broken(const char *what, int r) {
    if (!atomic_exchange(&g_timing_broken, 1))
        HAMI_LOG(HAMI_LOG_WARN, "%s failed (%d): launches cannot be timed, so the compute limit cannot be enforced",
                 what, r);
}

static int collect(struct hami_vdcu_timing *slot) {
    if (hami_real.hipEventQuery(slot->end) != hipSuccess) {
        if (++slot->misses < 100000u) return 0;
        slot->busy = 0;
        return 1;
    }
    slot->busy = 0;
    float ms = 0;
    if (hami_real.hipEventElapsedTime(&ms, slot->start, slot->end) == hipSuccess && ms >= 0)
        hami_iso_launch_timed(&slot->launch, (uint64_t)((double)ms * 1e6));
    return 1;
}

static void drop_events(struct hami_vdcu_thread *t) {
    for (int i = 0; i < HAMI_VDCU_TIMINGS; i++) {
        struct hami_vdcu_timing *slot = &t->timings[i];
        if (slot->start && hami_real.hipEventDestroy) hami_real.hipEventDestroy(slot->start);
        if (slot->end && hami_real.hipEventDestroy) hami_real.hipEventDestroy(slot->end);
        slot->start = slot->end = NULL;
        slot->busy = 0;
    }
}

static int have_events(struct hami_vdcu_thread *t, int device) {
    if (t->timings[0].start && t->events_device == device) return 1;
    if (!hami_real.hipEventCreate || !hami_real.hipEventRecord || !hami_real.hipEventQuery ||
        !hami_real.hipEventElapsedTime || !hami_real.hipEventSynchronize) {
        timing_broken("finding the runtime's event functions", hipErrorNotSupported);
        return 0;
    }
    drop_events(t);
    for (int i = 0; i < HAMI_VDCU_TIMINGS; i++) {
        struct hami_vdcu_timing *slot = &t->timings[i];
        hipError_t r = hami_real.hipEventCreate(&slot->start);
        if (r == hipSuccess) r = hami_real.hipEventCreate(&slot->end);
        if (r != hipSuccess) {
            HAMI_LOG(HAMI_LOG_DEBUG, "hipEventCreate failed (%d): this launch is not timed", r);
            drop_events(t);
            return 0;
        }
    }
    t->events_device = device;
    return 1;
}

static struct hami_vdcu_timing *time_begin(int device, hipStream_t stream) {
    struct hami_vdcu_thread *t = &hami_vdcu_tls;
    if (atomic_load_explicit(&g_timing_broken, memory_order_relaxed) || !have_events(t, device)) return NULL;
    struct hami_vdcu_timing *free_slot = NULL;
    for (int i = 0; i < HAMI_VDCU_TIMINGS && !free_slot; i++) {
        struct hami_vdcu_timing *slot = &t->timings[i];
        if (!slot->busy || collect(slot)) free_slot = slot;
    }
    if (!free_slot) return NULL;
    if (hami_real.hipEventRecord(free_slot->start, stream) != hipSuccess) return NULL;
    return free_slot;
}

static void time_end(struct hami_vdcu_timing *slot, int decision, hipStream_t stream, hipError_t launched,
                     const hami_iso_launch *launch) {
    if (!slot || launched != hipSuccess) return;
    if (hami_real.hipEventRecord(slot->end, stream) != hipSuccess) return;
    slot->launch = *launch;
    slot->busy = 1;
    slot->misses = 0;
    if (decision == HAMI_ISO_LAUNCH_TIME_NOW && hami_real.hipEventSynchronize(slot->end) == hipSuccess)
        collect(slot);
}

#define LAUNCH(name, kernel, work, stream, call)                                                               \
    HAMI_HIP_ENTER(name);                                                                                      \
    if (hami_vdcu_from_hip(__builtin_return_address(0))) return hami_real.call;                                \
    int device = hami_vdcu_device();                                                                           \
    hami_iso_launch launch;                                                                                    \
    int decision =                                                                                             \
        hami_iso_launch_admit(device, (uint64_t)(uintptr_t)(kernel), (work), (void *)(stream), &launch);       \
    if (HAMI_LIKELY(decision == HAMI_ISO_LAUNCH_GO)) return hami_real.call;                                    \
    struct hami_vdcu_timing *slot = time_begin(device, (stream));                                              \
    hipError_t r = hami_real.call;                                                                             \
    time_end(slot, decision, (stream), r, &launch);                                                            \
    return r;

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
