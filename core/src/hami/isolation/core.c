/*
 * core.c: start-up and shutdown of the core in one process. hami_iso_init() runs once (the first hooked call
 * of any thread triggers it; nothing runs at load time, so processes that never touch the device, which
 * /etc/ld.so.preload loads us into too, pay nothing). A forked child forgets its parent's slot and
 * allocations; at exit a process that holds no device memory gives its slot back at once, one that still
 * holds some leaves it to be reclaimed when it is really gone (the driver frees its memory only then).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

struct hami_process hami_proc;

static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_ready;

static void after_fork_in_child(void) {
    g_init_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    hami_track_reset();
    atomic_store(&hami_proc.context_counted, 0); /* the child has no context of its own yet */
    hami_region_after_fork(&hami_proc);
}

int hami_iso_ready(void) { return atomic_load_explicit(&g_ready, memory_order_acquire); }

int hami_iso_init(const hami_iso_vendor *vendor) {
    if (HAMI_LIKELY(atomic_load_explicit(&g_ready, memory_order_acquire))) return 0;
    pthread_mutex_lock(&g_init_lock);
    if (atomic_load_explicit(&g_ready, memory_order_relaxed)) {
        pthread_mutex_unlock(&g_init_lock);
        return 0;
    }
    struct hami_process *p = &hami_proc;
    p->vendor = vendor;
    hami_log_set_vendor(vendor->name);
    hami_config_read(vendor, p);
    p->pid = (int32_t)getpid();
    p->start_time = hami_process_start_time(p->pid);
    const char *path = vendor->shared_cache_env ? getenv(vendor->shared_cache_env) : NULL;
    if (!path || !*path) path = vendor->default_cache_path;
    static struct hami_control no_control[HAMI_ISO_MAX_DEVICES];
    for (int d = 0; d < HAMI_ISO_MAX_DEVICES; d++) p->devices[d].control = &no_control[d]; /* until known */
    int rc = hami_region_open(p, path);
    if (rc == 0) hami_region_take_slot(p);
    struct hami_control *granted = p->granted ? hami_grant_control(vendor) : NULL;
    if (granted || p->granted || !p->header) { /* with a grant, never the tenant-writable accounting file's */
        p->control = (char *)(granted ? granted : no_control);
        p->control_stride = sizeof(struct hami_control);
    } else {
        p->control = (char *)&p->header->devices[0].control_mode;
        p->control_stride = sizeof(struct hami_region_device);
    }
    for (int d = 0; d < HAMI_ISO_MAX_DEVICES; d++) p->devices[d].control = hami_control_of(p, d);
    pthread_atfork(NULL, NULL, after_fork_in_child);
    if (hami_log_level >= HAMI_LOG_INFO) {
        for (int d = 0; d < HAMI_ISO_MAX_DEVICES; d++)
            if (d == 0 || p->devices[d].memory_limit != p->devices[0].memory_limit ||
                p->devices[d].core_limit != p->devices[0].core_limit)
                hami_log(HAMI_LOG_INFO, "device %d%s: memory limit %llu bytes, compute limit %d%%%s", d, d ? "" : " (and all not listed)",
                         (unsigned long long)p->devices[d].memory_limit, p->devices[d].core_limit,
                         p->devices[d].core_limit && !p->devices[d].limited ? " (disabled by policy)" : "");
        hami_log(HAMI_LOG_INFO, "accounting in %s%s, slot %ld", path ? path : "(none)",
                 p->shared ? "" : " (process-private)",
                 p->slot && p->slot != &p->private_slot ? (long)(p->slot - p->slots) : -1L);
    }
    atomic_store_explicit(&g_ready, 1, memory_order_release);
    pthread_mutex_unlock(&g_init_lock);
    return rc;
}

void hami_iso_set_device_count(int count) {
    struct hami_process *p = &hami_proc;
    if (!p->header || count < 0) return;
    if (count > HAMI_ISO_MAX_DEVICES) {
        HAMI_LOG(HAMI_LOG_WARN, "%d devices visible; only the first %d are accounted", count, HAMI_ISO_MAX_DEVICES);
        count = HAMI_ISO_MAX_DEVICES;
    }
    atomic_store_explicit(&p->header->device_count, (uint32_t)count, memory_order_relaxed);
}

uint64_t hami_iso_memory_limit(int device) {
    if (device < 0 || device >= HAMI_ISO_MAX_DEVICES) return 0;
    return hami_proc.devices[device].memory_limit;
}

int hami_iso_core_limit(int device) {
    if (device < 0 || device >= HAMI_ISO_MAX_DEVICES) return 0;
    return hami_proc.devices[device].limited ? hami_proc.devices[device].core_limit : 0;
}

int hami_iso_oversubscribe(void) { return hami_proc.oversubscribe; }

__attribute__((destructor)) static void hami_iso_exit(void) {
    if (atomic_load_explicit(&g_ready, memory_order_acquire)) hami_region_leave(&hami_proc);
}
