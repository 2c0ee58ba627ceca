/*
 * fake_device.c: the fake hardware of fake_device.h: configuration, the shared state file, allocations backed by
 * host memory and counted in it, and the per-device timeline of work. Compiled into a fake library with
 * -fvisibility=hidden, so none of this is exported: the library's own API is all it shows.
 */
#define _GNU_SOURCE
#include "fake_device.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

struct fake_config fake = {1, 16ull << 30, 0};
struct fake_state *fake_state;

static const char *g_prefix = "";
static uint64_t g_kernel_ns, g_ns_per_block, g_queue_ns = 20000000ull;
static int g_backing = 1;
static uint64_t g_context_bytes; /* P CONTEXT_MIB */
static _Atomic uint32_t g_contexts; /* devices (bit i) on which this process's context memory is taken */
static int g_blurred; /* P EVENT_TIMING=queued: an event is reached when this process's own work is done */
static _Atomic uint64_t g_last_end; /* when this process's queued work is done */

uint64_t fake_env(const char *name, uint64_t fallback) {
    char variable[128];
    snprintf(variable, sizeof variable, "%s%s", g_prefix, name);
    const char *v = getenv(variable);
    if (!v || !*v) return fallback;
    char *end;
    uint64_t x = strtoull(v, &end, 10);
    switch (*end) {
    case 'k': case 'K': x <<= 10; break;
    case 'm': case 'M': x <<= 20; break;
    case 'g': case 'G': x <<= 30; break;
    default: break;
    }
    return x;
}

void fake_device_load(const char *prefix, uint64_t default_memory) {
    g_prefix = prefix;
    uint64_t devices = fake_env("DEVICES", 1);
    fake.devices = devices > FAKE_MAX_DEVICES ? FAKE_MAX_DEVICES : (int)devices;
    fake.memory = fake_env("MEMORY", default_memory);
    fake.tag = (int)(fake_env("TAG", 0) % FAKE_TAGS);
    g_kernel_ns = fake_env("KERNEL_NS", 0);
    g_ns_per_block = fake_env("KERNEL_NS_PER_BLOCK", 0);
    g_queue_ns = fake_env("QUEUE_NS", 20000000ull);
    g_backing = !fake_env("NO_BACKING", 0);
    g_context_bytes = fake_env("CONTEXT_MIB", 0) << 20;
    char variable[128];
    snprintf(variable, sizeof variable, "%sEVENT_TIMING", prefix);
    const char *timing = getenv(variable);
    g_blurred = timing && !strcmp(timing, "queued");
    snprintf(variable, sizeof variable, "%sSTATE", prefix);
    const char *path = getenv(variable);
    if (path && *path) {
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd >= 0) {
            void *m = mmap(NULL, FAKE_STATE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            close(fd);
            if (m != MAP_FAILED) fake_state = m;
        }
    }
    if (!fake_state) fake_state = calloc(1, sizeof *fake_state);
}

/* ---- memory ---------------------------------------------------------------------------------------------- */

#define BLOCK_MAGIC 0x6b636f6c62656b61ull
struct block {
    uint64_t magic;
    uint64_t size;
    int device;
    int counted;
    struct block *prev, *next;
    uint64_t pad[3];
};
_Static_assert(sizeof(struct block) == 64, "header keeps user memory aligned");

static pthread_mutex_t g_blocks_lock = PTHREAD_MUTEX_INITIALIZER;
static struct block g_blocks = {0, 0, 0, 0, &g_blocks, &g_blocks, {0, 0, 0}};

static int64_t driver_pid(void);

/* This process's entry for `device` in the per-process table (taken when `take`), NULL when none. */
static struct fake_process_memory *process_entry(int device, int take) {
    int32_t pid = (int32_t)driver_pid();
    for (int pass = 0; pass < 2; pass++)
        for (unsigned i = 0; i < FAKE_PROCESS_ENTRIES; i++) {
            struct fake_process_memory *e = &fake_state->processes[i];
            int32_t who = atomic_load(&e->pid);
            if (pass == 0 && who == pid && atomic_load(&e->device) == device) return e;
            if (pass == 1 && take && who == 0) {
                int32_t free_ = 0;
                atomic_store(&e->device, device);
                atomic_store(&e->bytes, 0);
                if (atomic_compare_exchange_strong(&e->pid, &free_, pid)) return e;
            }
        }
    return NULL;
}

static void count_process(int device, uint64_t size, int add) {
    struct fake_process_memory *e = process_entry(device, add);
    if (!e) return;
    if (add) atomic_fetch_add(&e->bytes, size);
    else if (atomic_fetch_sub(&e->bytes, size) == size) atomic_store(&e->pid, 0);
}

unsigned fake_process_memory(int device, int64_t *pids, uint64_t *bytes, unsigned max, unsigned *total) {
    unsigned n = 0, all = 0;
    for (unsigned i = 0; i < FAKE_PROCESS_ENTRIES; i++) {
        struct fake_process_memory *e = &fake_state->processes[i];
        int32_t pid = atomic_load(&e->pid);
        uint64_t held = atomic_load(&e->bytes);
        if (!pid || atomic_load(&e->device) != device || !held) continue;
        if (kill(pid, 0) != 0 && errno == ESRCH) continue; /* killed: the driver freed it */
        all++;
        if (n < max) {
            pids[n] = pid;
            bytes[n] = held;
            n++;
        }
    }
    *total = all;
    return n;
}

static int take_memory(int device, uint64_t size) {
    struct fake_device_state *d = &fake_state->devices[device];
    uint64_t cur = atomic_load(&d->allocated);
    do {
        if (size > fake.memory || cur > fake.memory - size) return 0;
    } while (!atomic_compare_exchange_weak(&d->allocated, &cur, cur + size));
    uint64_t peak = atomic_load(&d->peak);
    while (cur + size > peak && !atomic_compare_exchange_weak(&d->peak, &peak, cur + size)) {
    }
    atomic_fetch_add(&d->allocations, 1);
    count_process(device, size, 1);
    return 1;
}

static void give_memory(int device, uint64_t size) {
    atomic_fetch_sub(&fake_state->devices[device].allocated, size);
    count_process(device, size, 0);
}

uint64_t fake_used(int device) { return atomic_load(&fake_state->devices[device].allocated); }

void *fake_alloc(int device, uint64_t size, int counted) {
    if (counted && !take_memory(device, size)) return NULL;
    if (!counted) atomic_fetch_add(&fake_state->devices[device].host_allocations, 1);
    struct block *b = malloc(sizeof *b + (g_backing ? size : 0));
    if (!b) {
        if (counted) give_memory(device, size);
        return NULL;
    }
    b->magic = BLOCK_MAGIC;
    b->size = size;
    b->device = device;
    b->counted = counted;
    pthread_mutex_lock(&g_blocks_lock);
    b->next = g_blocks.next;
    b->prev = &g_blocks;
    g_blocks.next->prev = b;
    g_blocks.next = b;
    pthread_mutex_unlock(&g_blocks_lock);
    return b + 1;
}

int fake_free(void *p) {
    if (!p) return 0;
    struct block *b = (struct block *)p - 1;
    pthread_mutex_lock(&g_blocks_lock);
    if (b->magic != BLOCK_MAGIC) {
        pthread_mutex_unlock(&g_blocks_lock);
        return 0;
    }
    b->magic = 0;
    b->prev->next = b->next;
    b->next->prev = b->prev;
    pthread_mutex_unlock(&g_blocks_lock);
    if (b->counted) give_memory(b->device, b->size);
    free(b);
    return 1;
}

void fake_reset_device(int device) {
    pthread_mutex_lock(&g_blocks_lock);
    for (struct block *b = g_blocks.next; b != &g_blocks;) {
        struct block *next = b->next;
        if (b->device == device && b->counted) {
            b->magic = 0;
            b->prev->next = b->next;
            b->next->prev = b->prev;
            give_memory(b->device, b->size);
            free(b);
        }
        b = next;
    }
    pthread_mutex_unlock(&g_blocks_lock);
}

int fake_context_up(int device) {
    uint32_t bit = 1u << device;
    if (!g_context_bytes || (atomic_fetch_or(&g_contexts, bit) & bit)) return 1;
    if (take_memory(device, g_context_bytes)) return 1;
    atomic_fetch_and(&g_contexts, ~bit);
    return 0;
}

__attribute__((destructor)) static void fake_unload(void) {
    for (int i = 0; i < FAKE_MAX_DEVICES; i++)
        if (atomic_fetch_and(&g_contexts, ~(1u << i)) & (1u << i)) give_memory(i, g_context_bytes);
    pthread_mutex_lock(&g_blocks_lock);
    for (struct block *b = g_blocks.next; b != &g_blocks; b = b->next)
        if (b->magic == BLOCK_MAGIC && b->counted) {
            b->magic = 0;
            give_memory(b->device, b->size);
        }
    pthread_mutex_unlock(&g_blocks_lock);
}

/* ---- time ------------------------------------------------------------------------------------------------ */

uint64_t fake_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void fake_sleep_until(uint64_t t) {
    for (uint64_t now = fake_now_ns(); now < t; now = fake_now_ns()) {
        struct timespec ts = {(time_t)((t - now) / 1000000000ull), (long)((t - now) % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
}

uint64_t fake_kernel_ns(uint64_t blocks) { return g_kernel_ns + g_ns_per_block * blocks; }

uint64_t fake_reached(int device) {
    uint64_t now = fake_now_ns(), busy = atomic_load(&fake_state->devices[device].busy_until);
    if (g_blurred) busy = atomic_load(&g_last_end); /* "queued": other processes' work is not waited for */
    return busy > now ? busy : now; /* the device reaches it after what is queued before it */
}

void fake_synchronize(void) { fake_sleep_until(atomic_load(&g_last_end)); }

/* This process's queued work (its "command buffer"): the end times and lengths of launches not finished yet. */
#define QUEUE_SLOTS 4096
static pthread_mutex_t g_queue_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_queue_end[QUEUE_SLOTS], g_queue_len[QUEUE_SLOTS];
static unsigned g_queue_head, g_queue_tail;
static uint64_t g_queued_ns;

/* Work of this process still queued at `now` (must hold g_queue_lock). */
static uint64_t queued(uint64_t now) {
    while (g_queue_head != g_queue_tail && g_queue_end[g_queue_head % QUEUE_SLOTS] <= now) {
        g_queued_ns -= g_queue_len[g_queue_head % QUEUE_SLOTS];
        g_queue_head++;
    }
    return g_queued_ns;
}

/* Record that [start, end) of the timeline is this process's. Lock-free (a process killed here leaves at most
 * one record half-written): a launch that follows this process's previous one on the timeline extends that
 * record; any other takes the next one. */
static _Atomic uint64_t g_my_record[FAKE_MAX_DEVICES]; /* index + 1 of this process's newest record */

/* The pid a kernel driver knows this process by, the host's: /proc/self names it in the pid namespace of the /proc
 * mounted here (in the tests' pid namespaces, made without a /proc of their own, the host's); getpid() where it
 * cannot be read. Looked up once per process. */
static int64_t driver_pid(void) {
    static _Atomic int64_t g_for, g_pid;
    int64_t own = (int64_t)getpid();
    if (atomic_load(&g_for) == own) return atomic_load(&g_pid);
    int64_t pid = own;
    char link[32], *end;
    ssize_t n = readlink("/proc/self", link, sizeof link - 1);
    if (n > 0) {
        link[n] = 0;
        long long value = strtoll(link, &end, 10);
        if (!*end && value > 0) pid = value;
    }
    atomic_store(&g_pid, pid);
    atomic_store(&g_for, own);
    return pid;
}

static void record_run(int device, uint64_t start, uint64_t end) {
    struct fake_runs *runs = &fake_state->runs[device];
    int64_t pid = driver_pid();
    uint64_t mine = atomic_load(&g_my_record[device]);
    if (mine) {
        struct fake_run_record *last = &runs->records[(mine - 1) % FAKE_RUNS];
        uint64_t seq = atomic_load(&last->seq), expected = start;
        if (!(seq & 1) && atomic_load(&last->pid) == pid &&
            atomic_compare_exchange_strong(&last->end_ns, &expected, end) && atomic_load(&last->seq) == seq)
            return;
    }
    uint64_t i = atomic_fetch_add(&runs->next, 1);
    struct fake_run_record *r = &runs->records[i % FAKE_RUNS];
    uint64_t seq = atomic_load(&r->seq);
    atomic_store(&r->seq, seq | 1);
    atomic_store(&r->pid, pid);
    atomic_store(&r->start_ns, start);
    atomic_store(&r->end_ns, end);
    atomic_store(&r->seq, (seq | 1) + 1);
    atomic_store(&g_my_record[device], i + 1);
}

uint64_t fake_busy_ns(int device, int64_t pid, uint64_t from_ns, uint64_t to_ns, uint64_t *covered_from) {
    struct fake_runs *runs = &fake_state->runs[device];
    uint64_t busy = 0, oldest = UINT64_MAX;
    int wrapped = atomic_load(&runs->next) > FAKE_RUNS;
    for (unsigned i = 0; i < FAKE_RUNS; i++) {
        struct fake_run_record *r = &runs->records[i];
        uint64_t seq = atomic_load(&r->seq);
        int64_t who = atomic_load(&r->pid);
        uint64_t start = atomic_load(&r->start_ns), end = atomic_load(&r->end_ns);
        if (!seq || (seq & 1) || seq != atomic_load(&r->seq)) continue; /* empty, or being written */
        if (start < oldest) oldest = start;
        if (who != pid) continue;
        uint64_t a = start > from_ns ? start : from_ns, b = end < to_ns ? end : to_ns;
        if (b > a) busy += b - a;
    }
    if (covered_from) *covered_from = wrapped && oldest != UINT64_MAX && oldest > from_ns ? oldest : from_ns;
    return busy;
}

void fake_run(int device, uint64_t duration) {
    if (!duration) return;
    /* A full queue blocks the launch before it is queued, as a full command buffer does. */
    pthread_mutex_lock(&g_queue_lock);
    for (uint64_t now = fake_now_ns(); queued(now) > g_queue_ns || g_queue_tail - g_queue_head >= QUEUE_SLOTS;
         now = fake_now_ns()) {
        uint64_t wake = g_queue_end[g_queue_head % QUEUE_SLOTS];
        pthread_mutex_unlock(&g_queue_lock);
        fake_sleep_until(wake);
        pthread_mutex_lock(&g_queue_lock);
    }
    struct fake_device_state *d = &fake_state->devices[device];
    uint64_t now = fake_now_ns(), busy = atomic_load(&d->busy_until), end;
    do {
        end = (busy > now ? busy : now) + duration;
    } while (!atomic_compare_exchange_weak(&d->busy_until, &busy, end));
    record_run(device, end - duration, end);
    g_queue_end[g_queue_tail % QUEUE_SLOTS] = end;
    g_queue_len[g_queue_tail % QUEUE_SLOTS] = duration;
    g_queue_tail++;
    g_queued_ns += duration;
    pthread_mutex_unlock(&g_queue_lock);
    atomic_fetch_add(&d->busy_ns[fake.tag], duration);
    atomic_fetch_add(&d->launches, 1);
    uint64_t last = atomic_load(&g_last_end);
    while (end > last && !atomic_compare_exchange_weak(&g_last_end, &last, end)) {
    }
}
