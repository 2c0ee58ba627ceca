/*
 * launch.c: every way work reaches the device passes the core's compute limiter first: CNDrv's cnInvokeKernel and
 * cnInvokeKernelEx, and CNRT's cnrtInvokeKernel (what BANG C's <<<>>> lowers to). Launches from inside CNDrv or
 * CNRT pass straight through (runtime.c), so a CNRT launch reaching CNDrv is admitted once.
 *
 * The share is device time, measured: when the limiter asks for a measurement, the core's launch timer (hookkit.c)
 * brackets the launch by two CNRT notifiers placed on the launch's queue (cnrtNotifierCreate, cnrtPlaceNotifier,
 * cnrtQueryNotifier, cnrtWaitNotifier, cnrtNotifierElapsedTime); CNRT's queue is CNDrv's, so the same notifiers
 * time CNDrv launches. Without CNRT no launch is timed (the limiter then charges its estimates). Without a limit
 * the fast path is one call into the core and the launch.
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "vmlu.h"

static int notifier_create(void **n) { return hami_real.cnrtNotifierCreate((cnrtNotifier_t *)n); }
static void notifier_destroy(void *n) {
    if (hami_real.cnrtNotifierDestroy) hami_real.cnrtNotifierDestroy((cnrtNotifier_t)n);
}
static int notifier_place(void *n, void *queue) {
    return hami_real.cnrtPlaceNotifier((cnrtNotifier_t)n, (cnrtQueue_t)queue);
}
static int notifier_query(void *n) { return hami_real.cnrtQueryNotifier((cnrtNotifier_t)n); }
static int notifier_elapsed(float *ms, void *start, void *end) {
    return hami_real.cnrtNotifierElapsedTime((cnrtNotifier_t)start, (cnrtNotifier_t)end, ms);
}
static int notifier_wait(void *n) { return hami_real.cnrtWaitNotifier((cnrtNotifier_t)n); }

static hami_iso_events g_events = {.api = "cnrtNotifier", .destroy = notifier_destroy};
static pthread_once_t g_events_once = PTHREAD_ONCE_INIT;

static void find_events(void) { /* the table lists only what the installed CNRT has */
    if (hami_real.cnrtNotifierCreate) g_events.create = notifier_create;
    if (hami_real.cnrtPlaceNotifier) g_events.record = notifier_place;
    if (hami_real.cnrtQueryNotifier) g_events.query = notifier_query;
    if (hami_real.cnrtNotifierElapsedTime) g_events.elapsed_ms = notifier_elapsed;
    if (hami_real.cnrtWaitNotifier) g_events.synchronize = notifier_wait;
}

static const hami_iso_events *events(void) {
    pthread_once(&g_events_once, find_events);
    return &g_events;
}

#define LAUNCH(enter, name, result, kernel, work, queue, call)                                                 \
    enter(name);                                                                                               \
    if (FROM_INSIDE()) return hami_real.call;                                                                  \
    int device = hami_vmlu_device();                                                                           \
    HAMI_ISO_LAUNCH(events(), device, (uint64_t)device, (kernel), (work), (queue), result, hami_real.call);

HAMI_EXPORT CNresult cnInvokeKernel(CNkernel hkernel, unsigned int dimx, unsigned int dimy, unsigned int dimz,
                                    KernelClass c, unsigned int reserve, CNqueue hqueue, void **kernelParams,
                                    void **extra) {
    LAUNCH(HAMI_CN_ENTER, cnInvokeKernel, CNresult, hkernel, (uint64_t)dimx * dimy * dimz, hqueue,
           cnInvokeKernel(hkernel, dimx, dimy, dimz, c, reserve, hqueue, kernelParams, extra))
}

/* The configuration's layout is not read (its dimensions and queue are the driver's business): the launch is
 * admitted as one unit of work on the default queue's timeline. */
HAMI_EXPORT CNresult cnInvokeKernelEx(const CNinvokeConfig *config, CNkernel hkernel, void **kernelParams,
                                      void **extra) {
    LAUNCH(HAMI_CN_ENTER, cnInvokeKernelEx, CNresult, hkernel, 1, NULL,
           cnInvokeKernelEx(config, hkernel, kernelParams, extra))
}

HAMI_EXPORT cnrtRet_t cnrtInvokeKernel(const void *kernel, cnrtDim3_t dim, cnrtFunctionType_t ktype, void **args,
                                       size_t reserved, cnrtQueue_t queue) {
    LAUNCH(HAMI_CNRT_ENTER, cnrtInvokeKernel, cnrtRet_t, kernel, (uint64_t)dim.x * dim.y * dim.z, queue,
           cnrtInvokeKernel(kernel, dim, ktype, args, reserved, queue))
}
