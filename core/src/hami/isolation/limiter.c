/*
 * limiter.c: keeps a container's share of device time near its limit (CUDA_DEVICE_SM_LIMIT percent).
 *
 * The resource is device time, so that is what is charged: not blocks, not launches. Each device has a token
 * bucket in the accounting file, shared by all processes of the container, filled at limit% of wall time (at
 * most 50 ms worth) and drained by every launch's device time. A launch is charged in advance with an estimate
 * and the launching thread sleeps while the bucket is in debt, so the device can never be fed more than the
 * share in the long run, whatever the grid size or kernel length.
 *
 * Estimates come from measurements: the vendor layer times launches when asked (events around the launch), one
 * launch in 32 per thread, every launch of a kernel shape measured fewer than 5 times, and the first launch on a
 * device synchronously (nothing is known yet). An estimate is kept per kernel and size class (log2 of the
 * blocks) in a small direct-mapped cache, with a per-device average for the rest; each measured launch also
 * corrects the bucket by the difference between what it was charged and what it counted for.
 *
 * A measurement can be more than the launch's own time, never less: the events are on the device's timeline,
 * so whatever other work (another container's, another context's time slice) the device ran between the start
 * event and the kernel counts too: a thread preempted between the two, or blocked in the launch by a full
 * queue, measures its 4 ms kernel at 8-30 ms. Taken as it is, such an outlier would be the estimate charged for
 * the next 31 launches (an error of x in it costs about 32x in device time: one inflated measurement could
 * starve a 10 % container for seconds). So a measurement counts for the median of it and the kernel's two
 * measurements before: one inflated measurement in three is ignored, and a kernel whose time really changes is
 * followed from its second measurement at the new time on. A new kernel's estimate is the lowest of its first 5
 * measurements (taken at its next launches, cheaply: containers starting together inflate each other's first
 * ones, seen three in a row), and then moves a quarter of the way to each median.
 *
 * Events cannot tell the launch's own time from other work the device ran between them, and a device that
 * time-slices contexts runs the other containers' queued work there: with a 90 % container keeping the queue full,
 * every measurement of a 10 % container's 4 ms kernel reads 4-8 ms, none clean, and a bucket drained by those held
 * it at 1:11-1:17 instead of 1:9. So where the vendor can ask the device what it ran for this process
 * (hami_iso_vendor.device_busy: NVML's per-process utilization in the CUDA layer), the share is held by that:
 * every 50 ms (asked from the launching thread, when it flushes a millisecond of charges or waits in debt; no
 * thread of our own) the difference between the device time the device counted for the process since the last
 * answer and what its launches were charged meanwhile (charges are flushed per thread at least every millisecond
 * of them) is owed to the bucket. Over any run of answers the bucket is thus drained by the device time the
 * process's work really took, whatever the estimates; while answers come, the events' corrections are left out
 * of the bucket, and every launch is charged its events' estimate times what the device counted per nanosecond
 * charged (the scale, moved halfway each 100 ms and 20 ms of charges), so that the pacing between answers
 * follows the device's count too.
 *
 * An answer may lag the work: NVML documents samples stamped with a time, over a sampling period the driver
 * chooses, and one legitimate reading is a percentage over the last second stamped now (the vendor layer places
 * the samples; launch.c). Paid into the bucket at once, a lagging figure drives it like a thermostat read a
 * second late: the container runs while the figure still shows the quiet second before, the bucket fills to its
 * cap and what it would have held back is lost, then it waits a second for the figure to fall: 70 % measured 47-55 %.
 * So what is owed is paid in over SETTLE_NS (in proportion to the time between answers: all of it within
 * 500 ms), the bucket stays driven by the charges from moment to moment and by the device's count over time, and
 * the scale leaves out the first second of answers (a second's average covers time before the work began).
 * Measured on the fake device (tests/isolation/test_compute.py, 2-core host) under the three readings of the
 * documentation (fake_nvml.c: per span since lastSeenTimeStamp, per last second, per 166 ms period): one container
 * limited to 70 % / 30 % gets 69.9 / 29.8 %, 67.1-74.3 / 31.7-32.2 %, 69.8 / 30.3 %; 10:90 with queued timing
 * 1:9.4-9.9, 1:10.4-12.2 (1:7.4 over a longer run: integer percents of a 10 % container's second are 10 % apart),
 * 1:8.6-10.7. Without answers (no such library, a pid namespace without the node daemon's map of host pids, an
 * error) the limiter works from the events alone, as above: exact with clean timing, short with blurred.
 *
 * The bucket is refilled lazily: only a thread that finds it in debt refills it from the elapsed time, so a
 * launch under the limit costs one atomic subtraction. GPU_CORE_UTILIZATION_POLICY=disable turns all of this
 * off; the node daemon may lift the limit for a while (policy default only: "force" keeps it) or make
 * low-priority containers (CUDA_TASK_PRIORITY >= 1) yield for a while, through the file's control words. Both
 * expire by themselves, so a daemon that dies cannot stop a container.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <time.h>

#include "internal.h"

#define SAMPLE_EVERY 32u  /* a power of two */
#define FLUSH_EVERY 64u   /* launches counted per thread before the shared counters are updated */
#define FLUSH_NS 1000000  /* ... or device time charged */
#define ESTIMATE_YOUNG 5u /* a new kernel is timed at each launch until measured this many times */
#define BUSY_EVERY_NS 50000000ull /* how often the vendor's device_busy is asked */
#define WINDOW_NS 20000000       /* device time charged between moves of the events' scale ... */
#define WINDOW_SPAN_NS 100000000ull /* ... and wall time (an answer may average the last second) */
#define WINDOW_SKIP_NS 1000000000ull /* answers left out of the scale after they start */
#define SETTLE_NS 500000000ll     /* what the device counted is paid into the bucket over this long ... */
#define SETTLE_ALL_NS 100000ll    /* ... at once when it is less than this */

struct launch_stats {
    int device;
    uint32_t pending;
    uint64_t total;
    uint64_t device_ns;
    uint32_t sample;
};

static _Thread_local struct launch_stats tls __attribute__((tls_model("initial-exec")));

static void poll_busy(int device);

static inline void flush_stats(void) {
    if (tls.pending) hami_slot_add_launches(tls.device, tls.pending, tls.device_ns);
    if (tls.device_ns) {
        atomic_fetch_add_explicit(&hami_proc.devices[tls.device].charged_ns, (int64_t)tls.device_ns,
                                  memory_order_relaxed);
        poll_busy(tls.device);
    }
    tls.pending = 0;
    tls.device_ns = 0;
}

static inline void count_launch(int device, uint64_t device_ns) {
    if (HAMI_UNLIKELY(tls.device != device)) {
        flush_stats();
        tls.device = device;
    }
    tls.pending++;
    tls.device_ns += device_ns;
    /* the first launch, then every 64th, or every millisecond of device time charged */
    if ((++tls.total & (FLUSH_EVERY - 1)) == 1 || tls.device_ns >= FLUSH_NS) flush_stats();
}

/* What the device counted for this process (the vendor's device_busy) replaces what it was charged: the bucket
 * pays the difference, so over any stretch of polls the container's bucket is drained by the device time its work
 * really took, however wrong the estimates, and whatever the events measured. */
static void poll_busy(int device) {
    struct hami_process *p = &hami_proc;
    if (!p->vendor || !p->vendor->device_busy || !p->header) return;
    struct hami_process_device *pd = &p->devices[device];
    if (!pd->limited) return;
    uint64_t now = hami_mono_ns(), last = atomic_load_explicit(&pd->busy_poll_ns, memory_order_relaxed);
    if (now - last < BUSY_EVERY_NS ||
        !atomic_compare_exchange_strong_explicit(&pd->busy_poll_ns, &last, now, memory_order_acquire,
                                                 memory_order_relaxed))
        return;
    int64_t charged = atomic_load_explicit(&pd->charged_ns, memory_order_relaxed);
    uint64_t busy = 0;
    int answer = p->vendor->device_busy(device, &busy);
    if (answer > 0) return; /* nothing new: what was charged since is settled with the next answer */
    if (answer != 0) {
        pd->window_real = pd->window_charged = 0;
        pd->window_from_ns = pd->settled_ns = 0;
        pd->charged_seen = charged;
        atomic_store_explicit(&pd->busy_known, 0, memory_order_relaxed);
        return;
    }
    int64_t real = busy > (uint64_t)INT64_MAX / 4 ? INT64_MAX / 4 : (int64_t)busy;
    int64_t owed = real - (charged - pd->charged_seen);
    if (!pd->window_from_ns) pd->window_from_ns = now + WINDOW_SKIP_NS; /* answers lag: the first ones may not
                                                                          * cover the process's work yet */
    if (now >= pd->window_from_ns) {
        pd->window_real += real;
        pd->window_charged += charged - pd->charged_seen;
    }
    pd->charged_seen = charged;
    if (pd->window_charged >= WINDOW_NS && pd->window_real > 0 && now - pd->window_from_ns >= WINDOW_SPAN_NS) {
        /* estimates come from the events: scale what they measure by what the device counted per ns charged, so
         * that the launches' pacing follows the device's count too (not only the bucket's corrections) */
        uint64_t scale = atomic_load_explicit(&pd->scale, memory_order_relaxed);
        if (!scale) scale = 65536;
        uint64_t target = scale * (uint64_t)pd->window_real / (uint64_t)pd->window_charged;
        if (target < 4096) target = 4096;        /* 1/16 */
        if (target > 1048576) target = 1048576;  /* 16 */
        atomic_store_explicit(&pd->scale, (uint32_t)((scale + target) / 2), memory_order_relaxed);
        pd->window_real = pd->window_charged = 0;
        pd->window_from_ns = now;
    }
    atomic_store_explicit(&pd->busy_known, 1, memory_order_relaxed);
    /* paid into the bucket smoothly (see the header): a part of what is owed in proportion to the time since the
     * last question, all of it over SETTLE_NS */
    pd->owed_ns += owed;
    uint64_t elapsed = pd->settled_ns && now - pd->settled_ns < SETTLE_NS ? now - pd->settled_ns : SETTLE_NS;
    pd->settled_ns = now;
    int64_t pay = (int64_t)((__int128)pd->owed_ns * (int64_t)elapsed / (int64_t)SETTLE_NS);
    if (pay > -SETTLE_ALL_NS && pay < SETTLE_ALL_NS) pay = pd->owed_ns;
    pd->owed_ns -= pay;
    if (pay) atomic_fetch_sub_explicit(&p->header->devices[device].tokens_ns, pay, memory_order_relaxed);
    if (pay > 0) hami_slot_add_launches(device, 0, (uint64_t)pay);
}

static void sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Whether the node daemon's control word lifts the limit now; waits while it asks this container to yield. */
static int controlled(struct hami_process *p, struct hami_control *c) {
    if (p->policy == HAMI_POLICY_DISABLE) return 0;
    for (;;) {
        uint32_t mode = atomic_load_explicit(&c->mode, memory_order_acquire);
        uint64_t until = atomic_load_explicit(&c->until_ns, memory_order_acquire);
        if (mode == HAMI_CONTROL_NONE || hami_wall_ns() >= until) return 0;
        if (mode == HAMI_CONTROL_LIFT) return p->policy == HAMI_POLICY_DEFAULT;
        if (mode != HAMI_CONTROL_YIELD || p->priority < 1) return 0;
        sleep_ns(1000000); /* a higher-priority container is busy on this device */
    }
}

static void refill(struct hami_process_device *pd, struct hami_region_device *rd) {
    uint64_t now = hami_mono_ns();
    uint64_t last = atomic_load_explicit(&rd->refill_ns, memory_order_relaxed);
    if (now <= last ||
        !atomic_compare_exchange_strong_explicit(&rd->refill_ns, &last, now, memory_order_relaxed,
                                                 memory_order_relaxed))
        return;
    uint64_t elapsed = now - last;
    if (elapsed > 1000000000ull) elapsed = 1000000000ull; /* idle for long: the cap below applies anyway */
    int64_t add = (int64_t)(elapsed * (uint64_t)pd->core_limit / 100u);
    int64_t tokens = atomic_fetch_add_explicit(&rd->tokens_ns, add, memory_order_relaxed) + add;
    while (tokens > pd->burst_ns &&
           !atomic_compare_exchange_weak_explicit(&rd->tokens_ns, &tokens, pd->burst_ns, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
}

static void throttle(struct hami_process *p, struct hami_process_device *pd, struct hami_region_device *rd,
                     struct hami_control *control, void *stream, int64_t charged) {
    int capture_checked = 0;
    for (;;) {
        if (p->vendor && p->vendor->device_busy) poll_busy((int)(pd - p->devices));
        refill(pd, rd);
        int64_t tokens = atomic_load_explicit(&rd->tokens_ns, memory_order_relaxed);
        if (tokens >= 0) return;
        if (!capture_checked) {
            capture_checked = 1;
            if (p->vendor && p->vendor->stream_capturing && p->vendor->stream_capturing(stream)) {
                /* captured into a graph, not run: charge it when the graph is launched */
                atomic_fetch_add_explicit(&rd->tokens_ns, charged, memory_order_relaxed);
                return;
            }
        }
        if (atomic_load_explicit(&control->mode, memory_order_relaxed) != HAMI_CONTROL_NONE && controlled(p, control))
            return;
        uint64_t wait = (uint64_t)(-tokens) * 100u / (uint64_t)pd->core_limit;
        if (wait < 20000) wait = 20000;
        if (wait > 20000000) wait = 20000000;
        sleep_ns(wait);
    }
}

static inline uint64_t estimate_key(uint64_t kernel, uint64_t work) {
    uint64_t size_class = 64u - (uint64_t)__builtin_clzll(work | 1u);
    uint64_t key = (kernel ^ (size_class << 58) ^ (size_class * 0x9e3779b97f4a7c15ull)) | 1u;
    return key;
}

static inline uint32_t estimate_index(uint64_t key) {
    return (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 56) & (HAMI_ESTIMATES - 1);
}

int hami_iso_launch_admit(int device, uint64_t kernel, uint64_t work, void *stream, hami_iso_launch *launch) {
    struct hami_process *p = &hami_proc;
    if (HAMI_UNLIKELY((unsigned)device >= HAMI_ISO_MAX_DEVICES || !p->header)) return HAMI_ISO_LAUNCH_GO;
    struct hami_process_device *pd = &p->devices[device];
    struct hami_region_device *rd = &p->header->devices[device];
    struct hami_control *control = pd->control;
    if (HAMI_UNLIKELY(atomic_load_explicit(&control->mode, memory_order_relaxed) != HAMI_CONTROL_NONE) &&
        controlled(p, control)) {
        count_launch(device, 0);
        return HAMI_ISO_LAUNCH_GO;
    }
    if (!pd->limited) {
        count_launch(device, 0);
        return HAMI_ISO_LAUNCH_GO;
    }

    uint64_t key = estimate_key(kernel, work);
    uint32_t index = estimate_index(key);
    struct hami_estimate *e = &pd->estimates[index];
    int decision = HAMI_ISO_LAUNCH_GO;
    int64_t estimate;
    if (HAMI_LIKELY(atomic_load_explicit(&e->key, memory_order_acquire) == key)) {
        estimate = atomic_load_explicit(&e->ns, memory_order_relaxed);
        if (HAMI_UNLIKELY(atomic_load_explicit(&e->samples, memory_order_relaxed) < ESTIMATE_YOUNG))
            decision = HAMI_ISO_LAUNCH_TIME; /* a new kernel: a later measurement may overrule an inflated one */
    } else {
        estimate = atomic_load_explicit(&pd->fallback_ns, memory_order_relaxed);
        decision = HAMI_ISO_LAUNCH_TIME;
    }
    if (HAMI_UNLIKELY(!atomic_load_explicit(&pd->measured, memory_order_relaxed)))
        decision = HAMI_ISO_LAUNCH_TIME_NOW;
    else if ((++tls.sample & (SAMPLE_EVERY - 1)) == 0 && decision == HAMI_ISO_LAUNCH_GO)
        decision = HAMI_ISO_LAUNCH_TIME;

    if (atomic_load_explicit(&pd->busy_known, memory_order_relaxed)) { /* the device's count per ns measured */
        uint32_t scale = atomic_load_explicit(&pd->scale, memory_order_relaxed);
        if (scale) estimate = (int64_t)(((unsigned __int128)estimate * scale) >> 16);
    }
    launch->device = device;
    launch->estimator = index;
    launch->kernel = key;
    launch->charged_ns = estimate;
    count_launch(device, (uint64_t)estimate);

    int64_t left = estimate ? atomic_fetch_sub_explicit(&rd->tokens_ns, estimate, memory_order_relaxed) - estimate
                            : atomic_load_explicit(&rd->tokens_ns, memory_order_relaxed);
    if (HAMI_UNLIKELY(left < 0)) throttle(p, pd, rd, control, stream, estimate);
    return decision;
}

static inline int64_t median3(int64_t a, int64_t b, int64_t c) {
    int64_t low = b < c ? b : c, high = b < c ? c : b;
    return a < low ? low : a > high ? high : a;
}

void hami_iso_launch_timed(const hami_iso_launch *launch, uint64_t device_ns) {
    struct hami_process *p = &hami_proc;
    int device = launch->device;
    if ((unsigned)device >= HAMI_ISO_MAX_DEVICES || !p->header) return;
    struct hami_process_device *pd = &p->devices[device];
    int64_t measured = device_ns > (uint64_t)INT64_MAX / 4 ? INT64_MAX / 4 : (int64_t)device_ns;
    int64_t counted = measured; /* what it counts for (see the header) */
    struct hami_estimate *e = &pd->estimates[launch->estimator & (HAMI_ESTIMATES - 1)];
    if (atomic_load_explicit(&e->key, memory_order_acquire) == launch->kernel) {
        uint32_t samples = atomic_load_explicit(&e->samples, memory_order_relaxed);
        int64_t old = atomic_load_explicit(&e->ns, memory_order_relaxed);
        if (samples < ESTIMATE_YOUNG) { /* the lowest measurement so far, and the history the medians start from */
            counted = measured < old ? measured : old;
            atomic_store_explicit(&e->ns, counted, memory_order_relaxed);
            atomic_store_explicit(&e->recent[0], counted, memory_order_relaxed);
            atomic_store_explicit(&e->recent[1], counted, memory_order_relaxed);
            atomic_store_explicit(&e->samples, samples + 1, memory_order_relaxed);
        } else {
            int64_t last = atomic_load_explicit(&e->recent[0], memory_order_relaxed);
            counted = median3(measured, last, atomic_load_explicit(&e->recent[1], memory_order_relaxed));
            atomic_store_explicit(&e->ns, old + (counted - old) / 4, memory_order_relaxed);
            atomic_store_explicit(&e->recent[1], last, memory_order_relaxed);
            atomic_store_explicit(&e->recent[0], measured, memory_order_relaxed);
        }
    } else {
        atomic_store_explicit(&e->key, 0, memory_order_release); /* readers never pair a key with a wrong time */
        atomic_store_explicit(&e->ns, measured, memory_order_relaxed);
        atomic_store_explicit(&e->recent[0], measured, memory_order_relaxed);
        atomic_store_explicit(&e->recent[1], measured, memory_order_relaxed);
        atomic_store_explicit(&e->samples, 1, memory_order_relaxed);
        atomic_store_explicit(&e->key, launch->kernel, memory_order_release);
    }
    if (!atomic_load_explicit(&pd->measured, memory_order_relaxed)) {
        atomic_store_explicit(&pd->fallback_ns, counted, memory_order_relaxed);
        atomic_store_explicit(&pd->measured, 1, memory_order_release);
    } else {
        int64_t old = atomic_load_explicit(&pd->fallback_ns, memory_order_relaxed);
        atomic_store_explicit(&pd->fallback_ns, old + (counted - old) / 8, memory_order_relaxed);
    }
    int64_t correction = counted - launch->charged_ns;
    if (pd->limited && correction && !atomic_load_explicit(&pd->busy_known, memory_order_relaxed)) {
        atomic_fetch_sub_explicit(&p->header->devices[device].tokens_ns, correction, memory_order_relaxed);
        if (correction > 0 && tls.device == device) tls.device_ns += (uint64_t)correction;
    }
}
