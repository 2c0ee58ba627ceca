/*
 * region.c: the accounting file shared by every process of a container (LAYOUT.md).
 *
 * Design, against the failures of the library this replaces:
 *   - a process owns one slot, found by (pid, start time) and never moved: nothing can be left pointing at
 *     a slot that now belongs to someone else;
 *   - the lock is a robust process-shared mutex: when its holder dies the kernel hands it to the next locker
 *     with EOWNERDEAD, who recomputes the container's totals from the live slots (so a death at any point of an
 *     update leaves nothing wrong) and marks the mutex consistent. Nobody waits for a dead process;
 *   - the container totals are 64-bit counters that are only ever lowered by what a slot held, never below 0;
 *   - a dead process's slot is reclaimed by whoever notices first: a process starting, an allocation that
 *     would otherwise fail, or a recovery. Liveness is kill(pid, 0), and for the thorough check
 *     /proc/<pid>/stat (zombies, and a pid reused by another process have another start time);
 *   - limits are written by every starting process for the node daemon to read, never frozen in the file;
 *   - the file is created and formatted under an fcntl lock (released by the kernel if its holder dies), and
 *     a file of another layout version is reformatted only when none of its processes is alive.
 * What must never happen here: a wait on another process that has no bound, or a crash of the application.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* ------------------------------------------------------------------------------------------------------ */
/* Processes                                                                                                */
/* ------------------------------------------------------------------------------------------------------ */

/* Start time (clock ticks after boot) and state letter of a process; -1 when /proc has no such process,
 * -2 when it could not be read for another reason. */
static int proc_stat(int32_t pid, uint64_t *start_time, char *state) {
    char path[64], buffer[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT || errno == ESRCH ? -1 : -2;
    ssize_t n = read(fd, buffer, sizeof buffer - 1);
    close(fd);
    if (n <= 0) return n == 0 ? -1 : -2;
    buffer[n] = 0;
    char *p = strrchr(buffer, ')'); /* the command name may contain anything, even ')' */
    if (!p || p[1] != ' ') return -2;
    p += 2;
    *state = *p;
    /* p is at field 3 (state); the start time is field 22 */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p) return -2;
        p++;
    }
    *start_time = strtoull(p, NULL, 10);
    return 0;
}

uint64_t hami_process_start_time(int32_t pid) {
    uint64_t start = 0;
    char state;
    if (proc_stat(pid, &start, &state) != 0) return 0;
    return start;
}

/* Whether the process that took a slot may still be running. Cheap: only kill(pid, 0) (a dead pid is dead
 * for sure). Thorough: also a zombie or a pid now used by another process counts as dead. */
static int slot_owner_alive(int32_t pid, uint64_t start_time, int thorough) {
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    if (!thorough) return 1;
    uint64_t start = 0;
    char state = 0;
    int r = proc_stat(pid, &start, &state);
    if (r == -1) return 0;
    if (r != 0) return 1; /* cannot tell: keep it */
    if (state == 'Z' || state == 'X' || state == 'x') return 0;
    return start_time == 0 || start == start_time;
}

/* ------------------------------------------------------------------------------------------------------ */
/* The file                                                                                                 */
/* ------------------------------------------------------------------------------------------------------ */

static int g_fd = -1;

static int lock_file(int fd, short type) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = 0;
    fl.l_len = 1;
    for (;;) {
        if (fcntl(fd, F_OFD_SETLKW, &fl) == 0) return 0;
        if (errno == EINTR) continue;
        if (errno != EINVAL) return -1;
        if (fcntl(fd, F_SETLKW, &fl) == 0) return 0; /* kernels without open file description locks */
        if (errno != EINTR) return -1;
    }
}

static void init_mutex(pthread_mutex_t *mutex) {
    pthread_mutexattr_t attributes;
    pthread_mutexattr_init(&attributes);
    pthread_mutexattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attributes, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(mutex, &attributes);
    pthread_mutexattr_destroy(&attributes);
}

/* The header's identity: what layout_matches() checks, when it was made, by whom. */
static void stamp_identity(struct hami_region_header *h, const char *vendor) {
    h->version = HAMI_REGION_VERSION;
    h->header_size = HAMI_REGION_HEADER_SIZE;
    h->slot_size = HAMI_REGION_SLOT_SIZE;
    h->slot_count = HAMI_REGION_SLOTS;
    h->device_slots = HAMI_ISO_MAX_DEVICES;
    h->created_ns = hami_wall_ns();
    snprintf(h->vendor, sizeof h->vendor, "%s", vendor ? vendor : "");
}

static void format_region(struct hami_region_header *h, const char *vendor) {
    memset(h, 0, HAMI_REGION_SIZE);
    stamp_identity(h, vendor);
    init_mutex(&h->lock.mutex);
    __atomic_store_n(&h->magic, HAMI_REGION_MAGIC, __ATOMIC_RELEASE); /* readers trust nothing before this */
}

static int layout_matches(const struct hami_region_header *h) {
    return __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == HAMI_REGION_MAGIC && h->version == HAMI_REGION_VERSION &&
           h->header_size == HAMI_REGION_HEADER_SIZE && h->slot_size == HAMI_REGION_SLOT_SIZE &&
           h->slot_count == HAMI_REGION_SLOTS && h->device_slots == HAMI_ISO_MAX_DEVICES;
}

/* A file of another version: does any of its processes still run? Every version keeps the first 64 bytes of
 * the header and the first 16 bytes of a slot (pid, state, start time), so this can be answered. */
static int other_version_in_use(const struct hami_region_header *h, size_t file_size) {
    if (h->magic != HAMI_REGION_MAGIC) return 0; /* not ours at all: nothing of ours can be using it */
    uint64_t header = h->header_size, slot = h->slot_size, count = h->slot_count;
    if (slot < 16 || header + slot * count > file_size) return 0;
    for (uint64_t i = 0; i < count; i++) {
        const char *base = (const char *)h + header + i * slot;
        int32_t pid;
        uint64_t start;
        memcpy(&pid, base, sizeof pid);
        memcpy(&start, base + 8, sizeof start);
        if (pid > 0 && slot_owner_alive(pid, start, 1)) return 1;
    }
    return 0;
}

static struct hami_region_header *private_region(const char *vendor) {
    void *m = mmap(NULL, HAMI_REGION_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    format_region(m, vendor);
    return m;
}

int hami_region_open(struct hami_process *p, const char *path) {
    const char *vendor = p->vendor ? p->vendor->name : "";
    struct hami_region_header *h = NULL;
    int fd = path && *path ? open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666) : -1;
    if (fd < 0) {
        HAMI_LOG(HAMI_LOG_WARN, "cannot open the accounting file %s (%s): limits hold per process only",
                 path ? path : "(none)", strerror(errno));
        goto private;
    }
    if (lock_file(fd, F_WRLCK) != 0) {
        HAMI_LOG(HAMI_LOG_WARN, "cannot lock the accounting file %s (%s): limits hold per process only", path,
                 strerror(errno));
        close(fd);
        goto private;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (st.st_size < (off_t)HAMI_REGION_SIZE && ftruncate(fd, HAMI_REGION_SIZE) != 0)) {
        HAMI_LOG(HAMI_LOG_WARN, "cannot size the accounting file %s (%s): limits hold per process only", path,
                 strerror(errno));
        close(fd);
        goto private;
    }
    size_t mapped = st.st_size > (off_t)HAMI_REGION_SIZE ? (size_t)st.st_size : HAMI_REGION_SIZE;
    void *m = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        HAMI_LOG(HAMI_LOG_WARN, "cannot map the accounting file %s (%s): limits hold per process only", path,
                 strerror(errno));
        close(fd);
        goto private;
    }
    h = m;
    if (!layout_matches(h)) {
        if (other_version_in_use(h, mapped)) {
            HAMI_LOG(HAMI_LOG_ERROR,
                     "the accounting file %s has layout version %u, in use by running processes; this library "
                     "writes version %u: limits hold per process only until they exit",
                     path, h->version, HAMI_REGION_VERSION);
            munmap(m, mapped);
            close(fd);
            goto private;
        }
        if (h->magic == HAMI_REGION_MAGIC)
            HAMI_LOG(HAMI_LOG_INFO, "reformatting %s (layout version %u, no process alive)", path, h->version);
        format_region(h, vendor);
        if (fchmod(fd, 0666) != 0) HAMI_LOG(HAMI_LOG_DEBUG, "cannot share %s with other users", path);
    }
    lock_file(fd, F_UNLCK);
    g_fd = fd; /* kept open: the mutex is re-created under its lock if it ever becomes unrecoverable */
    p->header = h;
    p->slots = (struct hami_region_slot *)((char *)h + HAMI_REGION_HEADER_SIZE);
    p->shared = 1;
    return 0;

private:
    h = private_region(vendor);
    if (!h) return -1;
    p->header = h;
    p->slots = (struct hami_region_slot *)((char *)h + HAMI_REGION_HEADER_SIZE);
    p->shared = 0;
    return 0;
}

/* ------------------------------------------------------------------------------------------------------ */
/* The lock                                                                                                 */
/* ------------------------------------------------------------------------------------------------------ */

static void reclaim_slot_locked(struct hami_process *p, uint32_t index);

/* After a process died holding the lock: drop every dead slot and recompute the totals from the live ones. */
static void repair_locked(struct hami_process *p) {
    struct hami_region_header *h = p->header;
    uint32_t hwm = atomic_load_explicit(&h->slot_hwm, memory_order_relaxed);
    if (hwm > HAMI_REGION_SLOTS) hwm = HAMI_REGION_SLOTS;
    uint64_t totals[HAMI_ISO_MAX_DEVICES] = {0};
    uint32_t processes = 0;
    for (uint32_t i = 0; i < hwm; i++) {
        struct hami_region_slot *s = &p->slots[i];
        int32_t pid = atomic_load_explicit(&s->pid, memory_order_relaxed);
        if (!pid) continue;
        if (pid != p->pid && !slot_owner_alive(pid, s->start_time, 1)) {
            reclaim_slot_locked(p, i);
            continue;
        }
        processes++;
        for (int d = 0; d < HAMI_ISO_MAX_DEVICES; d++)
            totals[d] += atomic_load_explicit(&s->devices[d].memory_used, memory_order_relaxed);
    }
    if (p->slot == &p->private_slot)
        for (int d = 0; d < HAMI_ISO_MAX_DEVICES; d++)
            totals[d] += atomic_load_explicit(&p->private_slot.devices[d].memory_used, memory_order_relaxed);
    for (int d = 0; d < HAMI_ISO_MAX_DEVICES; d++)
        atomic_store_explicit(&h->devices[d].memory_used, totals[d], memory_order_relaxed);
    atomic_store_explicit(&h->processes, processes, memory_order_relaxed);
}

static void region_lock(struct hami_process *p) {
    pthread_mutex_t *mutex = &p->header->lock.mutex;
    for (int attempt = 0;; attempt++) {
        int r = pthread_mutex_lock(mutex);
        if (HAMI_LIKELY(r == 0)) return;
        if (r == EOWNERDEAD) {
            HAMI_LOG(HAMI_LOG_WARN, "a process died holding the accounting lock; recovering its usage");
            repair_locked(p);
            pthread_mutex_consistent(mutex);
            return;
        }
        /* ENOTRECOVERABLE (someone released it without repairing) or a damaged mutex: make a new one, under the
         * file lock so that only one process does. */
        HAMI_LOG(HAMI_LOG_ERROR, "the accounting lock is unusable (%s); re-creating it", strerror(r));
        if (g_fd >= 0) lock_file(g_fd, F_WRLCK);
        if (pthread_mutex_trylock(mutex) != 0) init_mutex(mutex);
        else pthread_mutex_unlock(mutex);
        if (g_fd >= 0) lock_file(g_fd, F_UNLCK);
        if (attempt > 3) {
            init_mutex(mutex);
            attempt = 0;
        }
    }
}

static void region_unlock(struct hami_process *p) { pthread_mutex_unlock(&p->header->lock.mutex); }

/* ------------------------------------------------------------------------------------------------------ */
/* Slots                                                                                                    */
/* ------------------------------------------------------------------------------------------------------ */

static void reclaim_slot_locked(struct hami_process *p, uint32_t index) {
    struct hami_region_header *h = p->header;
    struct hami_region_slot *s = &p->slots[index];
    for (int d = 0; d < HAMI_ISO_MAX_DEVICES; d++) {
        uint64_t used = atomic_exchange_explicit(&s->devices[d].memory_used, 0, memory_order_relaxed);
        if (used) hami_sub_floor(&h->devices[d].memory_used, used);
        atomic_store_explicit(&s->devices[d].launches, 0, memory_order_relaxed);
        atomic_store_explicit(&s->devices[d].device_time_ns, 0, memory_order_relaxed);
        atomic_store_explicit(&s->devices[d].last_kernel_ns, 0, memory_order_relaxed);
    }
    atomic_store_explicit(&s->state, HAMI_SLOT_FREE, memory_order_relaxed);
    atomic_store_explicit(&s->pid, 0, memory_order_release);
    uint32_t n = atomic_load_explicit(&h->processes, memory_order_relaxed);
    if (n) atomic_store_explicit(&h->processes, n - 1, memory_order_relaxed);
}

struct candidate {
    uint32_t index;
    int32_t pid;
    uint64_t start_time;
};

#define MAX_CANDIDATES 256

/* Find slots whose process is gone, without the lock (it only reads); then reclaim them under the lock if
 * they still belong to the same dead process. Returns how many were reclaimed. */
static int reclaim_dead(struct hami_process *p, int thorough) {
    struct candidate found[MAX_CANDIDATES];
    int count = 0;
    uint32_t hwm = atomic_load_explicit(&p->header->slot_hwm, memory_order_acquire);
    if (hwm > HAMI_REGION_SLOTS) hwm = HAMI_REGION_SLOTS;
    for (uint32_t i = 0; i < hwm && count < MAX_CANDIDATES; i++) {
        struct hami_region_slot *s = &p->slots[i];
        int32_t pid = atomic_load_explicit(&s->pid, memory_order_acquire);
        if (!pid || pid == p->pid) continue;
        uint64_t start = s->start_time;
        if (!slot_owner_alive(pid, start, thorough)) found[count++] = (struct candidate){i, pid, start};
    }
    if (!count) return 0;
    int reclaimed = 0;
    region_lock(p);
    for (int k = 0; k < count; k++) {
        struct hami_region_slot *s = &p->slots[found[k].index];
        if (atomic_load_explicit(&s->pid, memory_order_relaxed) == found[k].pid &&
            s->start_time == found[k].start_time) {
            reclaim_slot_locked(p, found[k].index);
            reclaimed++;
        }
    }
    region_unlock(p);
    if (reclaimed) HAMI_LOG(HAMI_LOG_INFO, "reclaimed %d slot(s) of exited processes", reclaimed);
    return reclaimed;
}

/* Before refusing an allocation: give back what dead processes still hold. Rate-limited, so that a container
 * allocating at its limit does not scan for every refusal. */
static int reclaim_before_refusing(struct hami_process *p) {
    uint64_t now = hami_mono_ns();
    int thorough = 0;
    uint64_t last = atomic_load_explicit(&p->last_full_reclaim_ns, memory_order_relaxed);
    if (now - last > 1000000000ull &&
        atomic_compare_exchange_strong_explicit(&p->last_full_reclaim_ns, &last, now, memory_order_relaxed,
                                                memory_order_relaxed))
        thorough = 1;
    if (!thorough) {
        last = atomic_load_explicit(&p->last_cheap_reclaim_ns, memory_order_relaxed);
        if (now - last < 2000000ull ||
            !atomic_compare_exchange_strong_explicit(&p->last_cheap_reclaim_ns, &last, now, memory_order_relaxed,
                                                     memory_order_relaxed))
            return 0;
    }
    return reclaim_dead(p, thorough);
}

static void publish_uuids(struct hami_process *p) {
    const char *name = p->vendor ? p->vendor->visible_devices_env : NULL;
    const char *value = name ? getenv(name) : NULL;
    if (!value || !*value) return;
    int device = 0;
    const char *item = value;
    while (*item && device < HAMI_ISO_MAX_DEVICES) {
        const char *end = strchr(item, ',');
        size_t length = end ? (size_t)(end - item) : strlen(item);
        int numeric = length > 0;
        for (size_t i = 0; i < length; i++)
            if (item[i] < '0' || item[i] > '9') numeric = 0;
        int keyword = (length == 3 && !strncmp(item, "all", 3)) || (length == 4 && !strncmp(item, "none", 4)) ||
                      (length == 4 && !strncmp(item, "void", 4));
        if (length && !numeric && !keyword && length < sizeof p->header->devices[0].uuid) {
            memcpy(p->header->devices[device].uuid, item, length);
            p->header->devices[device].uuid[length] = 0;
        }
        device++;
        if (!end) break;
        item = end + 1;
    }
}

void hami_region_publish_limits(struct hami_process *p) {
    struct hami_region_header *h = p->header;
    for (int d = 0; d < HAMI_ISO_MAX_DEVICES; d++) {
        h->devices[d].memory_limit = p->devices[d].memory_limit;
        h->devices[d].core_limit = (uint32_t)p->devices[d].core_limit;
        h->devices[d].policy = (uint32_t)p->policy;
    }
    h->priority = (uint32_t)p->priority;
    h->flags = p->oversubscribe ? 1u : 0u;
    publish_uuids(p);
    atomic_store_explicit(&h->updated_ns, hami_wall_ns(), memory_order_relaxed);
}

static void claim_slot_locked(struct hami_process *p, uint32_t index) {
    struct hami_region_header *h = p->header;
    struct hami_region_slot *s = &p->slots[index];
    s->start_time = p->start_time;
    s->priority = p->priority;
    s->flags = 0;
    s->registered_ns = hami_wall_ns();
    for (int d = 0; d < HAMI_ISO_MAX_DEVICES; d++) {
        atomic_store_explicit(&s->devices[d].memory_used, 0, memory_order_relaxed);
        atomic_store_explicit(&s->devices[d].launches, 0, memory_order_relaxed);
        atomic_store_explicit(&s->devices[d].device_time_ns, 0, memory_order_relaxed);
        atomic_store_explicit(&s->devices[d].last_kernel_ns, 0, memory_order_relaxed);
    }
    atomic_store_explicit(&s->state, HAMI_SLOT_ACTIVE, memory_order_relaxed);
    atomic_store_explicit(&s->pid, p->pid, memory_order_release);
    if (atomic_load_explicit(&h->slot_hwm, memory_order_relaxed) < index + 1)
        atomic_store_explicit(&h->slot_hwm, index + 1, memory_order_release);
    atomic_fetch_add_explicit(&h->processes, 1, memory_order_relaxed);
    p->slot = s;
}

void hami_region_take_slot(struct hami_process *p) {
    struct hami_region_header *h = p->header;
    /* Without the lock: our own earlier slot (the image before an exec has our pid and start time) and slots of
     * processes that are certainly gone. */
    struct candidate dead[MAX_CANDIDATES];
    int dead_count = 0;
    int64_t mine = -1;
    uint32_t hwm = atomic_load_explicit(&h->slot_hwm, memory_order_acquire);
    if (hwm > HAMI_REGION_SLOTS) hwm = HAMI_REGION_SLOTS;
    for (uint32_t i = 0; i < hwm; i++) {
        struct hami_region_slot *s = &p->slots[i];
        int32_t pid = atomic_load_explicit(&s->pid, memory_order_acquire);
        if (!pid) continue;
        if (pid == p->pid) {
            if (s->start_time == p->start_time) mine = i;
            else if (dead_count < MAX_CANDIDATES) dead[dead_count++] = (struct candidate){i, pid, s->start_time};
        } else if (dead_count < MAX_CANDIDATES && !slot_owner_alive(pid, s->start_time, 0)) {
            dead[dead_count++] = (struct candidate){i, pid, s->start_time};
        }
    }

    region_lock(p);
    for (int k = 0; k < dead_count; k++) {
        struct hami_region_slot *s = &p->slots[dead[k].index];
        if (atomic_load_explicit(&s->pid, memory_order_relaxed) == dead[k].pid &&
            s->start_time == dead[k].start_time)
            reclaim_slot_locked(p, dead[k].index);
    }
    int64_t index = -1;
    if (mine >= 0 && atomic_load_explicit(&p->slots[mine].pid, memory_order_relaxed) == p->pid &&
        p->slots[mine].start_time == p->start_time) {
        reclaim_slot_locked(p, (uint32_t)mine); /* what the previous image held went with its address space */
        index = mine;
    }
    for (int pass = 0; index < 0 && pass < 2; pass++) {
        for (uint32_t i = 0; i < HAMI_REGION_SLOTS; i++)
            if (!atomic_load_explicit(&p->slots[i].pid, memory_order_relaxed)) {
                index = i;
                break;
            }
        if (index < 0 && pass == 0) repair_locked(p); /* full: drop zombies and reused pids too */
    }
    if (index >= 0) {
        claim_slot_locked(p, (uint32_t)index);
    } else {
        memset(&p->private_slot, 0, sizeof p->private_slot);
        p->slot = &p->private_slot;
        HAMI_LOG(HAMI_LOG_ERROR,
                 "all %u process slots of the accounting file are taken: this process's usage counts toward the "
                 "limit but is not reclaimed if it crashes",
                 HAMI_REGION_SLOTS);
    }
    hami_region_publish_limits(p);
    region_unlock(p);
}

void hami_region_leave(struct hami_process *p) {
    struct hami_region_slot *s = p->slot;
    atomic_store_explicit(&p->exiting, 1, memory_order_relaxed);
    if (!s || s == &p->private_slot || !p->header) return;
    region_lock(p);
    int holds = 0;
    for (int d = 0; d < HAMI_ISO_MAX_DEVICES; d++)
        if (atomic_load_explicit(&s->devices[d].memory_used, memory_order_relaxed)) holds = 1;
    /* Memory still allocated is freed by the driver when this process is gone, not now: its slot stays counted
     * until then, and whoever notices the death reclaims it. */
    if (!holds && atomic_load_explicit(&s->pid, memory_order_relaxed) == p->pid) {
        reclaim_slot_locked(p, (uint32_t)(s - p->slots));
        p->slot = NULL;
    }
    region_unlock(p);
}

void hami_region_after_fork(struct hami_process *p) {
    /* The child owns no device memory and no slot; it takes one when it uses the device. */
    p->pid = (int32_t)getpid();
    p->start_time = hami_process_start_time(p->pid);
    p->slot = NULL;
    for (int d = 0; d < HAMI_ISO_MAX_DEVICES; d++) p->devices[d].own_bytes = p->devices[d].others_ns = 0;
}

void hami_slot_add_launches(int device, uint64_t launches, uint64_t device_ns) {
    struct hami_process *p = &hami_proc;
    if (device < 0 || device >= HAMI_ISO_MAX_DEVICES || !p->header) return;
    uint64_t now = hami_coarse_wall_ns();
    struct hami_region_device *d = &p->header->devices[device];
    atomic_fetch_add_explicit(&d->launches, launches, memory_order_relaxed);
    if (device_ns) atomic_fetch_add_explicit(&d->device_time_ns, device_ns, memory_order_relaxed);
    atomic_store_explicit(&d->last_kernel_ns, now, memory_order_relaxed);
    struct hami_region_slot *s = p->slot;
    if (!s) return;
    atomic_fetch_add_explicit(&s->devices[device].launches, launches, memory_order_relaxed);
    if (device_ns) atomic_fetch_add_explicit(&s->devices[device].device_time_ns, device_ns, memory_order_relaxed);
    atomic_store_explicit(&s->devices[device].last_kernel_ns, now, memory_order_relaxed);
}

/* ------------------------------------------------------------------------------------------------------ */
/* Memory                                                                                                   */
/* ------------------------------------------------------------------------------------------------------ */

static inline int valid_device(int device) { return device >= 0 && device < HAMI_ISO_MAX_DEVICES; }

#define OTHERS_EVERY_NS 20000000ull /* the driver is asked about the others at least this often (by allocations) */
#define CONTAINER_PIDS 256          /* processes of a container asked about, at most */

/* The device memory the driver counts for the container's other processes on `device` (those the node daemon's
 * map names): 1 with *bytes and *count (how many processes), 0 when it cannot be known. Called without the region
 * lock (the management library may take a while); notes when it was asked, answer or not. */
static int driver_others(struct hami_process *p, int device, uint64_t *bytes, int *count) {
    struct hami_process_device *pd = &p->devices[device];
    pd->others_ns = hami_coarse_mono_ns();
    if (!p->vendor || !p->vendor->process_memory) return 0;
    unsigned own = 0, pids[CONTAINER_PIDS];
    if (!hami_iso_host_pid(&own)) own = 0;
    int n = hami_grant_container_host_pids(pids, CONTAINER_PIDS, own);
    if (n < 0) return 0; /* no map: the driver's figures cannot be told to be this container's */
    uint64_t found = 0;
    if (n > 0 && p->vendor->process_memory(device, pids, (size_t)n, &found) != 0) return 0;
    *bytes = found;
    *count = n;
    return 1;
}

/* The figures contradicted what this process holds (or the driver's count): this process's entry and the
 * container's total are set back to what can be proven (its own memory, the driver's count for the others, the
 * other live entries), and the file records that it happened, for the node daemon (LAYOUT.md). */
static void repair_figures_locked(struct hami_process *p, int device, uint64_t others) {
    struct hami_process_device *pd = &p->devices[device];
    struct hami_region_header *h = p->header;
    if (!layout_matches(h)) { /* the header itself was overwritten: its identity again (the lock is held) */
        stamp_identity(h, p->vendor ? p->vendor->name : NULL);
        __atomic_store_n(&h->magic, HAMI_REGION_MAGIC, __ATOMIC_RELEASE);
        hami_region_publish_limits(p);
    }
    struct hami_region_slot *s = p->slot;
    if (s != &p->private_slot && atomic_load_explicit(&s->pid, memory_order_relaxed) != p->pid) {
        s->start_time = p->start_time; /* our own entry, cleared: ours again */
        s->priority = p->priority;
        atomic_store_explicit(&s->state, HAMI_SLOT_ACTIVE, memory_order_relaxed);
        atomic_store_explicit(&s->pid, p->pid, memory_order_release);
        uint32_t index = (uint32_t)(s - p->slots);
        if (atomic_load_explicit(&h->slot_hwm, memory_order_relaxed) < index + 1)
            atomic_store_explicit(&h->slot_hwm, index + 1, memory_order_release);
        if (!atomic_load_explicit(&h->processes, memory_order_relaxed))
            atomic_store_explicit(&h->processes, 1, memory_order_relaxed);
    }
    atomic_store_explicit(&s->devices[device].memory_used, pd->own_bytes, memory_order_relaxed);
    uint64_t entries = 0;
    uint32_t hwm = atomic_load_explicit(&p->header->slot_hwm, memory_order_relaxed);
    if (hwm > HAMI_REGION_SLOTS) hwm = HAMI_REGION_SLOTS;
    for (uint32_t i = 0; i < hwm; i++)
        if (atomic_load_explicit(&p->slots[i].pid, memory_order_relaxed) && &p->slots[i] != p->slot)
            entries += atomic_load_explicit(&p->slots[i].devices[device].memory_used, memory_order_relaxed);
    uint64_t total = pd->own_bytes + (others > entries ? others : entries);
    struct hami_region_device *d = &p->header->devices[device];
    atomic_store_explicit(&d->memory_used, total, memory_order_relaxed);
    atomic_fetch_add_explicit(&d->tampered, 1, memory_order_relaxed);
    atomic_store_explicit(&d->tampered_ns, hami_wall_ns(), memory_order_relaxed);
}

static _Atomic int g_told_tampered;

int hami_iso_memory_reserve(int device, uint64_t bytes) {
    struct hami_process *p = &hami_proc;
    if (HAMI_UNLIKELY(p->fail_closed)) return -1;
    if (!valid_device(device) || !p->header) return 0;
    if (HAMI_UNLIKELY(atomic_load_explicit(&p->exiting, memory_order_relaxed))) return -1;
    if (HAMI_UNLIKELY(!p->slot)) hami_region_take_slot(p);
    uint64_t limit = p->devices[device].memory_limit;
    if (!limit) limit = UINT64_MAX;
    uint64_t near = limit == UINT64_MAX ? UINT64_MAX : limit - limit / 4; /* asks the driver from here on */
    struct hami_process_device *pd = &p->devices[device];
    struct hami_region_device *d = &p->header->devices[device];
    int asked = 0, others_known = 0, count = 0;
    uint64_t others = 0;
    for (int attempt = 0;;) {
        region_lock(p);
        uint64_t used = atomic_load_explicit(&d->memory_used, memory_order_relaxed);
        uint64_t own = pd->own_bytes;
        int contradicted = atomic_load_explicit(&p->slot->devices[device].memory_used, memory_order_relaxed) < own ||
                           used < own || !layout_matches(p->header);
        if (HAMI_UNLIKELY(!asked && limit != UINT64_MAX &&
                          (contradicted || bytes >= near || used >= near - bytes ||
                           hami_coarse_mono_ns() - pd->others_ns > OTHERS_EVERY_NS))) {
            region_unlock(p);
            asked = 1;
            others_known = driver_others(p, device, &others, &count);
            continue;
        }
        /* what the driver counts for the others beyond what the file says they hold, past rounding (2 MiB each) */
        uint64_t slack = (uint64_t)count * (2u << 20);
        int lowered = others_known && others > used - (used < own ? used : own) + slack;
        if (HAMI_UNLIKELY(lowered && asked == 1)) { /* once more: another process may have freed in between */
            region_unlock(p);
            asked = 2;
            uint64_t again = 0;
            int known = driver_others(p, device, &again, &count);
            if (known && again < others) others = again;
            others_known = others_known && known;
            continue;
        }
        if (HAMI_UNLIKELY(contradicted || lowered)) {
            repair_figures_locked(p, device, others_known ? others : 0);
            uint64_t repaired = atomic_load_explicit(&d->memory_used, memory_order_relaxed);
            region_unlock(p);
            if (!atomic_exchange(&g_told_tampered, 1))
                HAMI_LOG(HAMI_LOG_ERROR,
                         "the accounting file said %llu bytes were in use on device %d where this process holds "
                         "%llu and the driver counts %s%llu for the container's other processes: it was changed "
                         "behind the library's back; %llu bytes refused, the figures repaired to %llu",
                         (unsigned long long)used, device, (unsigned long long)own, others_known ? "" : "(unknown) ",
                         (unsigned long long)others, (unsigned long long)bytes, (unsigned long long)repaired);
            return -1;
        }
        if (others_known && others + own > used) used = others + own; /* the driver's count decides near the limit */
        if (bytes <= limit && used <= limit - bytes) {
            uint64_t now_used = atomic_load_explicit(&d->memory_used, memory_order_relaxed) + bytes;
            atomic_store_explicit(&d->memory_used, now_used, memory_order_relaxed);
            atomic_fetch_add_explicit(&p->slot->devices[device].memory_used, bytes, memory_order_relaxed);
            pd->own_bytes = own + bytes;
            if (now_used > atomic_load_explicit(&d->memory_peak, memory_order_relaxed))
                atomic_store_explicit(&d->memory_peak, now_used, memory_order_relaxed);
            if (HAMI_UNLIKELY(p->test_lock_hold_us)) usleep(p->test_lock_hold_us);
            region_unlock(p);
            return 0;
        }
        region_unlock(p);
        if (bytes > limit || attempt++ > 0 || !reclaim_before_refusing(p)) {
            HAMI_LOG(HAMI_LOG_INFO, "refused %llu bytes on device %d: %llu of %llu in use by the container",
                     (unsigned long long)bytes, device, (unsigned long long)used, (unsigned long long)limit);
            return -1;
        }
    }
}

void hami_iso_memory_release(int device, uint64_t bytes) {
    struct hami_process *p = &hami_proc;
    if (!valid_device(device) || !p->header || !bytes) return;
    region_lock(p);
    uint64_t taken = bytes;
    if (p->slot) taken = hami_sub_floor(&p->slot->devices[device].memory_used, bytes);
    hami_sub_floor(&p->header->devices[device].memory_used, taken);
    struct hami_process_device *pd = &p->devices[device];
    pd->own_bytes -= pd->own_bytes < bytes ? pd->own_bytes : bytes;
    region_unlock(p);
    if (taken != bytes)
        HAMI_LOG(HAMI_LOG_WARN, "released %llu bytes on device %d but this process held only %llu",
                 (unsigned long long)bytes, device, (unsigned long long)taken);
}

uint64_t hami_iso_memory_used(int device) {
    struct hami_process *p = &hami_proc;
    if (!valid_device(device) || !p->header) return 0;
    return atomic_load_explicit(&p->header->devices[device].memory_used, memory_order_relaxed);
}
