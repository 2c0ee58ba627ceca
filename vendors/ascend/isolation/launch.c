/*
 * launch.c: every way work reaches the device passes the core's compute limiter first: the runtime's kernel
 * launches (rtKernelLaunch, rtKernelLaunchWithFlagV2, rtKernelLaunchWithHandleV2, the AI CPU launches
 * rtAicpuKernelLaunchExWithArgs and rtAicpuKernelLaunchWithFlag) and model execution (rtModelExecute), and the
 * AscendCL entry points that may reach the device through runtime functions this library does not hook
 * (aclrtLaunchKernel, aclrtLaunchKernelWithConfig, aclopExecuteV2, aclmdlExecute, aclmdlExecuteAsync).
 *
 * Counted once: an AscendCL hook admits its call as one launch and marks the thread (depth > 0) while it runs, so
 * the runtime hooks underneath pass their launches straight through.
 *
 * The share is device time, measured: when the limiter asks for a measurement, the launch is bracketed by two
 * runtime events on its own stream; the elapsed time between them is the device's time for that work, read later
 * without waiting (rtEventQuery at a later measurement), or at once when the limiter has no estimate yet. Each
 * thread has several event pairs (created once per device), so a measurement waiting behind a deep queue does not
 * keep the next kinds of work from being measured: with one pair, work that always follows the same other work
 * can miss every chance to be measured and be charged the average of small kernels (seen with a fixed mix of
 * launch kinds). Without a limit the fast path is one call into the core and the real launch.
 */
#define _GNU_SOURCE
#include "vnpu.h"

static _Atomic int g_timing_broken;

static void timing_broken(const char *what, int r) {
    if (!atomic_exchange(&g_timing_broken, 1))
        HAMI_LOG(HAMI_LOG_WARN, "%s failed (%d): launches cannot be timed, so the compute limit cannot be enforced",
                 what, r);
}

/* Reports a busy slot's measurement if the device got past its end event; returns whether the slot is free. */
static int collect(struct hami_vnpu_timing *slot) {
    if (hami_real.rtEventQuery(slot->end) != RT_ERROR_NONE) {
        if (++slot->misses < 100000u) return 0;
        slot->busy = 0; /* an event that never completes: give it up rather than never timing again */
        return 1;
    }
    slot->busy = 0;
    float ms = 0;
    if (hami_real.rtEventElapsedTime(&ms, slot->start, slot->end) == RT_ERROR_NONE && ms >= 0)
        hami_iso_launch_timed(&slot->launch, (uint64_t)((double)ms * 1e6));
    return 1;
}

static void drop_events(struct hami_vnpu_thread *t) {
    for (int i = 0; i < HAMI_VNPU_TIMINGS; i++) {
        struct hami_vnpu_timing *slot = &t->timings[i];
        if (slot->start && hami_real.rtEventDestroy) hami_real.rtEventDestroy(slot->start);
        if (slot->end && hami_real.rtEventDestroy) hami_real.rtEventDestroy(slot->end);
        slot->start = slot->end = NULL;
        slot->busy = 0;
    }
}

/* The thread's event pairs for `device`, created on first use (and again when the thread changes device). */
static int have_events(struct hami_vnpu_thread *t, int device) {
    if (t->timings[0].start && t->events_device == device) return 1;
    if (!hami_real.rtEventCreate || !hami_real.rtEventRecord || !hami_real.rtEventQuery ||
        !hami_real.rtEventElapsedTime || !hami_real.rtEventSynchronize) {
        timing_broken("finding the runtime's event functions", ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
        return 0;
    }
    drop_events(t);
    for (int i = 0; i < HAMI_VNPU_TIMINGS; i++) {
        struct hami_vnpu_timing *slot = &t->timings[i];
        rtError_t r = hami_real.rtEventCreate(&slot->start);
        if (r == RT_ERROR_NONE) r = hami_real.rtEventCreate(&slot->end);
        if (r != RT_ERROR_NONE) {
            HAMI_LOG(HAMI_LOG_DEBUG, "rtEventCreate failed (%d): this launch is not timed", r);
            drop_events(t);
            return 0;
        }
    }
    t->events_device = device;
    return 1;
}

/* Before a launch the limiter wants timed: records the start event of a free slot; returns that slot, or NULL
 * when the launch is not timed (every slot is still waiting for the device). */
static struct hami_vnpu_timing *time_begin(int device, rtStream_t stream) {
    struct hami_vnpu_thread *t = &hami_vnpu_tls;
    if (atomic_load_explicit(&g_timing_broken, memory_order_relaxed) || !have_events(t, device)) return NULL;
    struct hami_vnpu_timing *free_slot = NULL;
    for (int i = 0; i < HAMI_VNPU_TIMINGS && !free_slot; i++) {
        struct hami_vnpu_timing *slot = &t->timings[i];
        if (!slot->busy || collect(slot)) free_slot = slot;
    }
    if (!free_slot) return NULL;
    rtError_t r = hami_real.rtEventRecord(free_slot->start, stream);
    if (r != RT_ERROR_NONE) {
        HAMI_LOG(HAMI_LOG_DEBUG, "rtEventRecord failed (%d): this launch is not timed", r);
        return NULL;
    }
    return free_slot;
}

static void time_end(struct hami_vnpu_timing *slot, int decision, rtStream_t stream, int launched,
                     const hami_iso_launch *launch) {
    if (!slot || launched != 0) return;
    if (hami_real.rtEventRecord(slot->end, stream) != RT_ERROR_NONE) return;
    slot->launch = *launch;
    slot->busy = 1;
    slot->misses = 0;
    if (decision == HAMI_ISO_LAUNCH_TIME_NOW && hami_real.rtEventSynchronize(slot->end) == RT_ERROR_NONE)
        collect(slot);
}

/* A runtime launch: passed through inside an AscendCL hook that already admitted it, else admitted here. */
#define RT_LAUNCH(name, kernel, work, stream, call)                                                            \
    HAMI_RT_ENTER(name);                                                                                       \
    if (hami_vnpu_tls.depth) return hami_real.call;                                                            \
    int device = hami_vnpu_device();                                                                           \
    hami_iso_launch launch;                                                                                    \
    int decision =                                                                                             \
        hami_iso_launch_admit(device, (uint64_t)(uintptr_t)(kernel), (work), (void *)(stream), &launch);       \
    if (HAMI_LIKELY(decision == HAMI_ISO_LAUNCH_GO)) return hami_real.call;                                    \
    struct hami_vnpu_timing *slot = time_begin(device, (stream));                                              \
    rtError_t r = hami_real.call;                                                                              \
    time_end(slot, decision, (stream), r, &launch);                                                          \
    return r;

/* An AscendCL launch: admitted here as one launch; the runtime calls underneath pass straight through. */
#define ACL_LAUNCH(name, kernel, work, stream, call)                                                           \
    HAMI_ACL_ENTER(name);                                                                                      \
    struct hami_vnpu_thread *t = &hami_vnpu_tls;                                                               \
    if (t->depth) return hami_real.call;                                                                       \
    int device = hami_vnpu_device();                                                                           \
    hami_iso_launch launch;                                                                                    \
    int decision =                                                                                             \
        hami_iso_launch_admit(device, (uint64_t)(uintptr_t)(kernel), (work), (void *)(stream), &launch);       \
    struct hami_vnpu_timing *slot = decision == HAMI_ISO_LAUNCH_GO ? NULL : time_begin(device, (stream));      \
    t->depth++;                                                                                                \
    aclError r = hami_real.call;                                                                               \
    t->depth--;                                                                                                \
    time_end(slot, decision, (stream), r, &launch);                                                            \
    return r;

/* ---- the runtime layer --------------------------------------------------------------------------------- */

HAMI_EXPORT rtError_t rtKernelLaunch(const void *stubFunc, uint32_t blockDim, void *args, uint32_t argsSize,
                                     rtSmDesc_t *smDesc, rtStream_t stm) {
    RT_LAUNCH(rtKernelLaunch, stubFunc, blockDim, stm, rtKernelLaunch(stubFunc, blockDim, args, argsSize, smDesc, stm))
}

HAMI_EXPORT rtError_t rtKernelLaunchWithFlagV2(const void *stubFunc, uint32_t blockDim, rtArgsEx_t *argsInfo,
                                               rtSmDesc_t *smDesc, rtStream_t stm, uint32_t flags,
                                               const rtTaskCfgInfo_t *cfgInfo) {
    RT_LAUNCH(rtKernelLaunchWithFlagV2, stubFunc, blockDim, stm,
              rtKernelLaunchWithFlagV2(stubFunc, blockDim, argsInfo, smDesc, stm, flags, cfgInfo))
}

HAMI_EXPORT rtError_t rtKernelLaunchWithHandleV2(void *hdl, const uint64_t tilingKey, uint32_t blockDim,
                                                 rtArgsEx_t *argsInfo, rtSmDesc_t *smDesc, rtStream_t stm,
                                                 const rtTaskCfgInfo_t *cfgInfo) {
    RT_LAUNCH(rtKernelLaunchWithHandleV2, (uintptr_t)hdl ^ (tilingKey * 0x9e3779b97f4a7c15ull), blockDim, stm,
              rtKernelLaunchWithHandleV2(hdl, tilingKey, blockDim, argsInfo, smDesc, stm, cfgInfo))
}

HAMI_EXPORT rtError_t rtAicpuKernelLaunchExWithArgs(const uint32_t kernelType, const char *const opName,
                                                    const uint32_t blockDim, const rtAicpuArgsEx_t *argsInfo,
                                                    rtSmDesc_t *const smDesc, const rtStream_t stm,
                                                    const uint32_t flags) {
    RT_LAUNCH(rtAicpuKernelLaunchExWithArgs, (uintptr_t)opName ^ kernelType, blockDim, stm,
              rtAicpuKernelLaunchExWithArgs(kernelType, opName, blockDim, argsInfo, smDesc, stm, flags))
}

HAMI_EXPORT rtError_t rtAicpuKernelLaunchWithFlag(const rtKernelLaunchNames_t *launchNames, uint32_t blockDim,
                                                  const rtArgsEx_t *argsInfo, rtSmDesc_t *smDesc, rtStream_t stm,
                                                  uint32_t flags) {
    RT_LAUNCH(rtAicpuKernelLaunchWithFlag, launchNames, blockDim, stm,
              rtAicpuKernelLaunchWithFlag(launchNames, blockDim, argsInfo, smDesc, stm, flags))
}

HAMI_EXPORT rtError_t rtModelExecute(rtModel_t mdl, rtStream_t stm, uint32_t flag) {
    RT_LAUNCH(rtModelExecute, mdl, 1, stm, rtModelExecute(mdl, stm, flag))
}

/* ---- the AscendCL layer -------------------------------------------------------------------------------- */

HAMI_EXPORT aclError aclrtLaunchKernel(aclrtFuncHandle funcHandle, uint32_t numBlocks, const void *argsData,
                                       size_t argsSize, aclrtStream stream) {
    ACL_LAUNCH(aclrtLaunchKernel, funcHandle, numBlocks, stream,
               aclrtLaunchKernel(funcHandle, numBlocks, argsData, argsSize, stream))
}

HAMI_EXPORT aclError aclrtLaunchKernelWithConfig(aclrtFuncHandle funcHandle, uint32_t numBlocks, aclrtStream stream,
                                                 aclrtLaunchKernelCfg *cfg, aclrtArgsHandle argsHandle,
                                                 void *reserve) {
    ACL_LAUNCH(aclrtLaunchKernelWithConfig, funcHandle, numBlocks, stream,
               aclrtLaunchKernelWithConfig(funcHandle, numBlocks, stream, cfg, argsHandle, reserve))
}

HAMI_EXPORT aclError aclopExecuteV2(const char *opType, int numInputs, aclTensorDesc *inputDesc[],
                                    aclDataBuffer *inputs[], int numOutputs, aclTensorDesc *outputDesc[],
                                    aclDataBuffer *outputs[], aclopAttr *attr, aclrtStream stream) {
    ACL_LAUNCH(aclopExecuteV2, opType, 1, stream,
               aclopExecuteV2(opType, numInputs, inputDesc, inputs, numOutputs, outputDesc, outputs, attr, stream))
}

HAMI_EXPORT aclError aclmdlExecute(uint32_t modelId, const aclmdlDataset *input, aclmdlDataset *output) {
    ACL_LAUNCH(aclmdlExecute, (uint64_t)modelId + 1u, 1, NULL, aclmdlExecute(modelId, input, output))
}

HAMI_EXPORT aclError aclmdlExecuteAsync(uint32_t modelId, const aclmdlDataset *input, aclmdlDataset *output,
                                        aclrtStream stream) {
    ACL_LAUNCH(aclmdlExecuteAsync, (uint64_t)modelId + 1u, 1, stream,
               aclmdlExecuteAsync(modelId, input, output, stream))
}
