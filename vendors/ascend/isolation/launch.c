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
 * The share is device time, measured: when the limiter asks for a measurement, the core's launch timer
 * (hookkit.c) brackets the launch by two runtime events on its own stream (several pairs per thread, created once
 * per device: with one pair, work that always follows the same other work can miss every chance to be measured);
 * the elapsed time between them is the device's time for that work. Without a limit the fast path is one call
 * into the core and the real launch.
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "vnpu.h"

/* The runtime's events, for the core's launch timer (hookkit.c). */
static int event_create(void **event) { return hami_real.rtEventCreate((rtEvent_t *)event); }
static void event_destroy(void *event) {
    if (hami_real.rtEventDestroy) hami_real.rtEventDestroy((rtEvent_t)event);
}
static int event_record(void *event, void *stream) { return hami_real.rtEventRecord((rtEvent_t)event, (rtStream_t)stream); }
static int event_query(void *event) { return hami_real.rtEventQuery((rtEvent_t)event); }
static int event_elapsed(float *ms, void *start, void *end) {
    return hami_real.rtEventElapsedTime(ms, (rtEvent_t)start, (rtEvent_t)end);
}
static int event_synchronize(void *event) { return hami_real.rtEventSynchronize((rtEvent_t)event); }

static hami_iso_events g_events = {.api = "rtEvent", .destroy = event_destroy};
static pthread_once_t g_events_once = PTHREAD_ONCE_INIT;

static void find_events(void) { /* the event table lists only the functions the runtime has */
    if (hami_real.rtEventCreate) g_events.create = event_create;
    if (hami_real.rtEventRecord) g_events.record = event_record;
    if (hami_real.rtEventQuery) g_events.query = event_query;
    if (hami_real.rtEventElapsedTime) g_events.elapsed_ms = event_elapsed;
    if (hami_real.rtEventSynchronize) g_events.synchronize = event_synchronize;
}

static const hami_iso_events *events(void) {
    pthread_once(&g_events_once, find_events);
    return &g_events;
}

/* A runtime launch: passed through inside an AscendCL hook that already admitted it, else admitted here. */
#define RT_LAUNCH(name, kernel, work, stream, call)                                                            \
    HAMI_RT_ENTER(name);                                                                                       \
    if (hami_vnpu_tls.depth) return hami_real.call;                                                            \
    int device = hami_vnpu_device();                                                                           \
    HAMI_ISO_LAUNCH(events(), device, (uint64_t)device, (kernel), (work), (stream), rtError_t, hami_real.call);

/* An AscendCL launch: admitted here as one launch; the runtime calls underneath pass straight through. */
#define ACL_LAUNCH(name, kernel, work, stream, call)                                                           \
    HAMI_ACL_ENTER(name);                                                                                      \
    struct hami_vnpu_thread *t = &hami_vnpu_tls;                                                               \
    if (t->depth) return hami_real.call;                                                                       \
    int device = hami_vnpu_device();                                                                           \
    hami_iso_launch launch;                                                                                    \
    int decision =                                                                                             \
        hami_iso_launch_admit(device, (uint64_t)(uintptr_t)(kernel), (work), (void *)(stream), &launch);       \
    hami_iso_timing *timing =                                                                                  \
        decision == HAMI_ISO_LAUNCH_GO ? NULL : hami_iso_time_begin(events(), (uint64_t)device, (void *)(stream)); \
    t->depth++;                                                                                                \
    aclError r = hami_real.call;                                                                               \
    t->depth--;                                                                                                \
    hami_iso_time_end(events(), timing, decision, (void *)(stream), r, &launch);                              \
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
