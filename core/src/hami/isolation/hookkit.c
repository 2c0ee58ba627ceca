/*
 * hookkit.c: what every vendor's hooks do the same way, whatever their API: remembering what an allocation
 * counted and giving it back when it is freed, the container's view of a device's memory for the memory queries,
 * and timing launches with the vendor's events for the compute limiter's measurements (hami_isolation.h says how
 * each is called). Nothing here calls the vendor's API except through the event table a vendor passes in.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <string.h>

#include "internal.h"

/* ---- memory ---------------------------------------------------------------------------------------------- */

void hami_iso_remember(uint32_t kind, uint64_t key, int device, uint64_t size, uint64_t owner) {
    hami_iso_allocation a = {size, owner, device, kind};
    if (hami_iso_track(kind, key, &a) != 0) hami_iso_memory_release(device, size); /* never found again: uncount */
}

void hami_iso_forgotten(uint32_t kind, uint64_t key, int known, const hami_iso_allocation *a, int freed) {
    if (!known) return;
    if (freed) hami_iso_memory_release(a->device, a->size);
    else hami_iso_track(kind, key, a);
}

int hami_iso_context_reserve(int device) {
    struct hami_process *p = &hami_proc;
    uint64_t bytes = p->context_bytes;
    if (!bytes || (unsigned)device >= HAMI_ISO_MAX_DEVICES) return 0;
    uint32_t bit = 1u << device;
    if (atomic_fetch_or(&p->context_counted, bit) & bit) return 0; /* counted already (or being counted) */
    if (hami_iso_memory_reserve(device, bytes) == 0) return 1;
    atomic_fetch_and(&p->context_counted, ~bit);
    return -1;
}

void hami_iso_context_unreserve(int device, int reserved) {
    if (reserved != 1) return;
    atomic_fetch_and(&hami_proc.context_counted, ~(1u << device));
    hami_iso_memory_release(device, hami_proc.context_bytes);
}

int hami_iso_memory_view(int device, uint64_t *total, uint64_t *free, uint64_t *used) {
    uint64_t limit = hami_iso_memory_limit(device);
    if (!limit || !total) return 0;
    uint64_t in_use = hami_iso_memory_used(device);
    int over = hami_iso_oversubscribe();
    *total = over || limit < *total ? limit : *total;
    if (free) {
        uint64_t physical_free = *free;
        *free = in_use >= *total ? 0 : *total - in_use;
        if (!over && *free > physical_free) *free = physical_free;
    }
    if (used) *used = in_use;
    return 1;
}

int hami_iso_memory_view_sizes(int device, size_t *free, size_t *total) {
    if (!total) return 0;
    uint64_t t = *total, f = free ? *free : 0;
    if (!hami_iso_memory_view(device, &t, free ? &f : NULL, NULL)) return 0;
    *total = (size_t)t;
    if (free) *free = (size_t)f;
    return 1;
}

/* ---- timing launches ------------------------------------------------------------------------------------- */

struct hami_iso_timing {
    void *start, *end;
    int busy;
    uint32_t misses; /* queries of the end event that found it not reached yet */
    hami_iso_launch launch;
};

struct timer_thread {
    uint64_t owner;
    int ready;
    struct hami_iso_timing timings[HAMI_ISO_TIMINGS];
};

static _Thread_local struct timer_thread g_timer __attribute__((tls_model("initial-exec")));
static _Atomic int g_timing_broken;

static void timing_broken(const hami_iso_events *events, const char *what) {
    if (!atomic_exchange(&g_timing_broken, 1))
        HAMI_LOG(HAMI_LOG_WARN, "%s%s: launches cannot be timed, so the compute limit cannot be enforced",
                 events->api ? events->api : "the event API", what);
}

/* Reports a busy pair's measurement if the device got past its end event; returns whether the pair is free. */
static int collect(const hami_iso_events *events, struct hami_iso_timing *t) {
    if (events->query(t->end) != 0) {
        if (++t->misses < 100000u) return 0;
        t->busy = 0; /* an event that never completes: give it up rather than never timing again */
        return 1;
    }
    t->busy = 0;
    float ms = 0;
    if (events->elapsed_ms(&ms, t->start, t->end) == 0 && ms >= 0)
        hami_iso_launch_timed(&t->launch, (uint64_t)((double)ms * 1e6));
    return 1;
}

static void drop_events(const hami_iso_events *events, struct timer_thread *thread) {
    for (int i = 0; i < HAMI_ISO_TIMINGS; i++) {
        struct hami_iso_timing *t = &thread->timings[i];
        if (t->start && events->destroy) events->destroy(t->start);
        if (t->end && events->destroy) events->destroy(t->end);
        t->start = t->end = NULL;
        t->busy = 0;
    }
    thread->ready = 0;
}

static int have_events(const hami_iso_events *events, struct timer_thread *thread, uint64_t owner) {
    if (thread->ready && thread->owner == owner) return 1;
    if (!events->create || !events->record || !events->query || !events->elapsed_ms || !events->synchronize) {
        timing_broken(events, " functions are missing");
        return 0;
    }
    drop_events(events, thread);
    for (int i = 0; i < HAMI_ISO_TIMINGS; i++) {
        struct hami_iso_timing *t = &thread->timings[i];
        int r = events->create(&t->start);
        if (r == 0) r = events->create(&t->end);
        if (r != 0) {
            HAMI_LOG(HAMI_LOG_DEBUG, "creating %s failed (%d): this launch is not timed",
                     events->api ? events->api : "an event", r);
            drop_events(events, thread);
            return 0;
        }
    }
    thread->owner = owner;
    thread->ready = 1;
    return 1;
}

hami_iso_timing *hami_iso_time_begin(const hami_iso_events *events, uint64_t owner, void *stream) {
    struct timer_thread *thread = &g_timer;
    if (!events || atomic_load_explicit(&g_timing_broken, memory_order_relaxed)) return NULL;
    if (events->capturing && events->capturing(stream)) return NULL; /* never add nodes to the user's graph */
    if (!have_events(events, thread, owner)) return NULL;
    struct hami_iso_timing *free_pair = NULL;
    for (int i = 0; i < HAMI_ISO_TIMINGS && !free_pair; i++) {
        struct hami_iso_timing *t = &thread->timings[i];
        if (!t->busy || collect(events, t)) free_pair = t;
    }
    if (!free_pair) return NULL;
    int r = events->record(free_pair->start, stream);
    if (r != 0) {
        HAMI_LOG(HAMI_LOG_DEBUG, "recording %s failed (%d): this launch is not timed",
                 events->api ? events->api : "an event", r);
        return NULL;
    }
    return free_pair;
}

void hami_iso_time_end(const hami_iso_events *events, hami_iso_timing *t, int decision, void *stream, int launched,
                       const hami_iso_launch *launch) {
    if (!t || launched != 0) return;
    if (events->record(t->end, stream) != 0) return;
    t->launch = *launch;
    t->busy = 1;
    t->misses = 0;
    if (decision == HAMI_ISO_LAUNCH_TIME_NOW && events->synchronize(t->end) == 0) collect(events, t);
}
