/*
 * fake_runtime.c: a fake Ascend runtime, built by the tests as libruntime.so and loaded behind libvnpu.so exactly as
 * the real one would be (the fake AscendCL, fake_acl.c, calls into it as the real libascendcl.so calls the real
 * runtime). It stands in for the hardware, so that what the isolation library claims can be checked against what
 * "really" happened:
 *   - devices: FAKE_NPU_DEVICES (default 1), each of FAKE_NPU_MEMORY bytes (k/m/g suffix; default 32g);
 *   - device allocations (rtMalloc of a device type, rtMallocPhysical on the device side) are backed by host memory
 *     (FAKE_NPU_NO_BACKING=1 keeps only a small header, for the benchmark) and counted per device in the shared
 *     state file FAKE_NPU_STATE (fake_state.h): what is really allocated now, and its peak, across every process;
 *     running out answers ACL_ERROR_RT_MEMORY_ALLOCATION (207001), as the real runtime does;
 *   - a kernel "runs" for FAKE_NPU_KERNEL_NS plus FAKE_NPU_KERNEL_NS_PER_BLOCK x blockDim (a model for
 *     FAKE_NPU_MODEL_NS, default the kernel time) on a per-device timeline shared by all processes (the device runs
 *     one thing at a time, in the order it was queued), credited to FAKE_NPU_TAG (0-7) of the launching process; a
 *     launch waits, before it is queued, while the process has more than FAKE_NPU_QUEUE_NS (default 20 ms) of its
 *     own work queued;
 *   - events are timestamps on that timeline; synchronization sleeps until the process's work is done;
 *   - rtLaunchKernelByFuncHandle and fake_rt_malloc_private / fake_rt_free_private are entry points libvnpu.so does
 *     not hook (what a newer AscendCL may call instead of the hooked ones).
 * On a normal exit it frees what the process still holds (the real driver frees a dead process's memory).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fake_state.h"

#define EXPORT __attribute__((visibility("default")))

typedef int32_t rtError_t;
typedef unsigned long long u64;

enum {
    OK = 0,
    PARAM_INVALID = 107000,
    DEVICE_INVALID = 107001,
    CONTEXT_NULL = 107002,
    MEMORY_ALLOCATION = 207001,
    MEMORY_FREE = 207002,
    EVENT_NOT_COMPLETE = 507017,
};

struct drv_mem_prop {
    uint32_t side, devid, module_id, pg_type, mem_type;
    uint64_t reserve;
};

struct event {
    u64 t;
    int recorded;
};

/* ---- configuration and state ---------------------------------------------------------------------------- */

static int g_devices = 1;
static u64 g_memory = 32ull << 30;
static u64 g_kernel_ns, g_ns_per_block, g_model_ns, g_queue_ns = 20000000ull;
static int g_tag, g_backing = 1;
static struct fake_state *S;
static _Atomic u64 g_last_end; /* when this process's queued work is done */

static __thread int t_device = -1;

static u64 now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (u64)ts.tv_sec * 1000000000ull + (u64)ts.tv_nsec;
}

static void sleep_until(u64 t) {
    for (u64 now = now_ns(); now < t; now = now_ns()) {
        struct timespec ts = {(time_t)((t - now) / 1000000000ull), (long)((t - now) % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
}

static u64 env_u64(const char *name, u64 fallback) {
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char *end;
    u64 x = strtoull(v, &end, 10);
    switch (*end) {
    case 'k': case 'K': x <<= 10; break;
    case 'm': case 'M': x <<= 20; break;
    case 'g': case 'G': x <<= 30; break;
    default: break;
    }
    return x;
}

__attribute__((constructor)) static void fake_load(void) {
    g_devices = (int)env_u64("FAKE_NPU_DEVICES", 1);
    if (g_devices < 0) g_devices = 0;
    if (g_devices > FAKE_MAX_DEVICES) g_devices = FAKE_MAX_DEVICES;
    g_memory = env_u64("FAKE_NPU_MEMORY", 32ull << 30);
    g_kernel_ns = env_u64("FAKE_NPU_KERNEL_NS", 0);
    g_ns_per_block = env_u64("FAKE_NPU_KERNEL_NS_PER_BLOCK", 0);
    g_model_ns = env_u64("FAKE_NPU_MODEL_NS", g_kernel_ns);
    g_queue_ns = env_u64("FAKE_NPU_QUEUE_NS", 20000000ull);
    g_tag = (int)env_u64("FAKE_NPU_TAG", 0) % FAKE_TAGS;
    g_backing = !env_u64("FAKE_NPU_NO_BACKING", 0);
    const char *path = getenv("FAKE_NPU_STATE");
    if (path && *path) {
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd >= 0) {
            void *m = mmap(NULL, FAKE_STATE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            close(fd);
            if (m != MAP_FAILED) S = m;
        }
    }
    if (!S) S = calloc(1, sizeof *S);
}

/* ---- memory --------------------------------------------------------------------------------------------- */

#define BLOCK_MAGIC 0x6b636f6c62757061ull
struct block {
    u64 magic;
    u64 size;
    int device;
    int counted;
    struct block *prev, *next;
    u64 pad[3];
};
_Static_assert(sizeof(struct block) == 64, "header keeps user memory aligned");

static pthread_mutex_t g_blocks_lock = PTHREAD_MUTEX_INITIALIZER;
static struct block g_blocks = {0, 0, 0, 0, &g_blocks, &g_blocks, {0, 0, 0}};

static int take_memory(int device, u64 size) {
    struct fake_device_state *d = &S->devices[device];
    u64 cur = atomic_load(&d->allocated);
    do {
        if (size > g_memory || cur > g_memory - size) return 0;
    } while (!atomic_compare_exchange_weak(&d->allocated, &cur, cur + size));
    u64 peak = atomic_load(&d->peak);
    while (cur + size > peak && !atomic_compare_exchange_weak(&d->peak, &peak, cur + size)) {
    }
    atomic_fetch_add(&d->allocations, 1);
    return 1;
}

static void give_memory(int device, u64 size) { atomic_fetch_sub(&S->devices[device].allocated, size); }

static void *new_block(int device, u64 size, int counted) {
    if (counted && !take_memory(device, size)) return NULL;
    if (!counted) atomic_fetch_add(&S->devices[device].host_allocations, 1);
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

static rtError_t free_block(void *p) {
    if (!p) return PARAM_INVALID;
    struct block *b = (struct block *)p - 1;
    pthread_mutex_lock(&g_blocks_lock);
    if (b->magic != BLOCK_MAGIC) {
        pthread_mutex_unlock(&g_blocks_lock);
        return MEMORY_FREE;
    }
    b->magic = 0;
    b->prev->next = b->next;
    b->next->prev = b->prev;
    pthread_mutex_unlock(&g_blocks_lock);
    if (b->counted) give_memory(b->device, b->size);
    free(b);
    return OK;
}

__attribute__((destructor)) static void fake_unload(void) {
    pthread_mutex_lock(&g_blocks_lock);
    for (struct block *b = g_blocks.next; b != &g_blocks; b = b->next)
        if (b->magic == BLOCK_MAGIC && b->counted) {
            b->magic = 0;
            give_memory(b->device, b->size);
        }
    pthread_mutex_unlock(&g_blocks_lock);
}

/* ---- devices -------------------------------------------------------------------------------------------- */

EXPORT rtError_t rtGetDeviceCount(int32_t *count) {
    if (!count) return PARAM_INVALID;
    *count = g_devices;
    return OK;
}

EXPORT rtError_t rtSetDevice(int32_t device) {
    if (device < 0 || device >= g_devices) return DEVICE_INVALID;
    t_device = device;
    return OK;
}

EXPORT rtError_t rtGetDevice(int32_t *device) {
    if (!device) return PARAM_INVALID;
    if (t_device < 0) return CONTEXT_NULL;
    *device = t_device;
    return OK;
}

/* A "context" is its device plus one, as a pointer. */
EXPORT rtError_t rtCtxCreate(void **ctx, uint32_t flags, int32_t device) {
    (void)flags;
    if (!ctx) return PARAM_INVALID;
    if (device < 0 || device >= g_devices) return DEVICE_INVALID;
    *ctx = (void *)(uintptr_t)(device + 1);
    t_device = device;
    return OK;
}

EXPORT rtError_t rtCtxSetCurrent(void *ctx) {
    intptr_t device = (intptr_t)ctx - 1;
    if (device < 0 || device >= g_devices) return CONTEXT_NULL;
    t_device = (int)device;
    return OK;
}

EXPORT rtError_t rtDeviceReset(int32_t device) {
    if (device < 0 || device >= g_devices) return DEVICE_INVALID;
    pthread_mutex_lock(&g_blocks_lock); /* everything of the device in this process is gone */
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
    if (t_device == device) t_device = -1;
    return OK;
}

/* ---- memory API ----------------------------------------------------------------------------------------- */

EXPORT rtError_t rtMalloc(void **p, uint64_t size, uint32_t type, uint16_t module) {
    (void)module;
    if (!p || !size) return PARAM_INVALID;
    int host = (type & 0x80u) != 0;
    if (!host && t_device < 0) return CONTEXT_NULL;
    void *b = new_block(host ? 0 : t_device, size, !host);
    if (!b) return MEMORY_ALLOCATION;
    *p = b;
    return OK;
}

EXPORT rtError_t rtFree(void *p) { return free_block(p); }

EXPORT rtError_t fake_rt_malloc_private(void **p, uint64_t size) { return rtMalloc(p, size, 2, 0); }

EXPORT rtError_t fake_rt_free_private(void *p) { return free_block(p); }

EXPORT rtError_t rtMallocPhysical(void **handle, size_t size, struct drv_mem_prop *prop, uint64_t flags) {
    (void)flags;
    if (!handle || !prop || !size) return PARAM_INVALID;
    int device_side = prop->side == 1;
    if (device_side && prop->devid >= (uint32_t)g_devices) return DEVICE_INVALID;
    void *b = new_block(device_side ? (int)prop->devid : 0, size, device_side);
    if (!b) return MEMORY_ALLOCATION;
    *handle = b;
    return OK;
}

EXPORT rtError_t rtFreePhysical(void *handle) { return free_block(handle); }

EXPORT rtError_t rtMemGetInfoEx(int kind, size_t *free, size_t *total) {
    (void)kind;
    if (t_device < 0) return CONTEXT_NULL;
    if (!free || !total) return PARAM_INVALID;
    u64 used = atomic_load(&S->devices[t_device].allocated);
    *total = g_memory;
    *free = used > g_memory ? 0 : g_memory - used;
    return OK;
}

EXPORT rtError_t rtMemGetInfo(size_t *free, size_t *total) { return rtMemGetInfoEx(1, free, total); }

/* ---- streams, events, launches -------------------------------------------------------------------------- */

EXPORT rtError_t rtStreamSynchronize(void *stream) {
    (void)stream;
    sleep_until(atomic_load(&g_last_end));
    return OK;
}

EXPORT rtError_t rtDeviceSynchronize(void) {
    sleep_until(atomic_load(&g_last_end));
    return OK;
}

EXPORT rtError_t rtEventCreate(struct event **e) {
    if (!e) return PARAM_INVALID;
    *e = calloc(1, sizeof **e);
    return OK;
}

EXPORT rtError_t rtEventDestroy(struct event *e) {
    free(e);
    return OK;
}

EXPORT rtError_t rtEventRecord(struct event *e, void *stream) {
    (void)stream;
    if (t_device < 0) return CONTEXT_NULL;
    if (!e) return PARAM_INVALID;
    u64 now = now_ns(), busy = atomic_load(&S->devices[t_device].busy_until);
    e->t = busy > now ? busy : now; /* the device reaches the event after what is queued before it */
    e->recorded = 1;
    return OK;
}

EXPORT rtError_t rtEventQuery(struct event *e) {
    if (!e) return PARAM_INVALID;
    return now_ns() >= e->t ? OK : EVENT_NOT_COMPLETE;
}

EXPORT rtError_t rtEventSynchronize(struct event *e) {
    if (!e) return PARAM_INVALID;
    sleep_until(e->t);
    return OK;
}

EXPORT rtError_t rtEventElapsedTime(float *ms, struct event *a, struct event *b) {
    if (!ms || !a || !b || !a->recorded || !b->recorded) return PARAM_INVALID;
    if (now_ns() < a->t || now_ns() < b->t) return EVENT_NOT_COMPLETE;
    *ms = (float)(((double)b->t - (double)a->t) / 1e6);
    return OK;
}

/* This process's queued work (its "command buffer"): the end times and lengths of launches not finished yet. */
#define QUEUE_SLOTS 4096
static pthread_mutex_t g_queue_lock = PTHREAD_MUTEX_INITIALIZER;
static u64 g_queue_end[QUEUE_SLOTS], g_queue_len[QUEUE_SLOTS];
static unsigned g_queue_head, g_queue_tail;
static u64 g_queued_ns;

static u64 queued(u64 now) {
    while (g_queue_head != g_queue_tail && g_queue_end[g_queue_head % QUEUE_SLOTS] <= now) {
        g_queued_ns -= g_queue_len[g_queue_head % QUEUE_SLOTS];
        g_queue_head++;
    }
    return g_queued_ns;
}

static rtError_t run(u64 duration) {
    if (t_device < 0) return CONTEXT_NULL;
    if (!duration) return OK;
    pthread_mutex_lock(&g_queue_lock);
    for (u64 now = now_ns(); queued(now) > g_queue_ns || g_queue_tail - g_queue_head >= QUEUE_SLOTS; now = now_ns()) {
        u64 wake = g_queue_end[g_queue_head % QUEUE_SLOTS];
        pthread_mutex_unlock(&g_queue_lock);
        sleep_until(wake);
        pthread_mutex_lock(&g_queue_lock);
    }
    struct fake_device_state *d = &S->devices[t_device];
    u64 now = now_ns(), busy = atomic_load(&d->busy_until), end;
    do {
        end = (busy > now ? busy : now) + duration;
    } while (!atomic_compare_exchange_weak(&d->busy_until, &busy, end));
    g_queue_end[g_queue_tail % QUEUE_SLOTS] = end;
    g_queue_len[g_queue_tail % QUEUE_SLOTS] = duration;
    g_queue_tail++;
    g_queued_ns += duration;
    pthread_mutex_unlock(&g_queue_lock);
    atomic_fetch_add(&d->busy_ns[g_tag], duration);
    atomic_fetch_add(&d->launches, 1);
    u64 last = atomic_load(&g_last_end);
    while (end > last && !atomic_compare_exchange_weak(&g_last_end, &last, end)) {
    }
    return OK;
}

static u64 kernel_time(uint32_t blocks) { return g_kernel_ns + g_ns_per_block * blocks; }

EXPORT rtError_t rtKernelLaunch(const void *stub, uint32_t blocks, void *args, uint32_t size, void *sm, void *stream) {
    (void)args, (void)size, (void)sm, (void)stream;
    if (!stub) return PARAM_INVALID;
    return run(kernel_time(blocks));
}

EXPORT rtError_t rtKernelLaunchWithFlagV2(const void *stub, uint32_t blocks, void *args, void *sm, void *stream,
                                          uint32_t flags, const void *cfg) {
    (void)args, (void)sm, (void)stream, (void)flags, (void)cfg;
    if (!stub) return PARAM_INVALID;
    return run(kernel_time(blocks));
}

EXPORT rtError_t rtKernelLaunchWithHandleV2(void *handle, uint64_t tiling, uint32_t blocks, void *args, void *sm,
                                            void *stream, const void *cfg) {
    (void)tiling, (void)args, (void)sm, (void)stream, (void)cfg;
    if (!handle) return PARAM_INVALID;
    return run(kernel_time(blocks));
}

EXPORT rtError_t rtAicpuKernelLaunchExWithArgs(uint32_t type, const char *name, uint32_t blocks, const void *args,
                                               void *sm, void *stream, uint32_t flags) {
    (void)type, (void)args, (void)sm, (void)stream, (void)flags;
    if (!name) return PARAM_INVALID;
    return run(kernel_time(blocks));
}

EXPORT rtError_t rtAicpuKernelLaunchWithFlag(const void *names, uint32_t blocks, const void *args, void *sm,
                                             void *stream, uint32_t flags) {
    (void)args, (void)sm, (void)stream, (void)flags;
    if (!names) return PARAM_INVALID;
    return run(kernel_time(blocks));
}

EXPORT rtError_t rtModelExecute(void *model, void *stream, uint32_t flag) {
    (void)stream, (void)flag;
    if (!model) return PARAM_INVALID;
    return run(g_model_ns);
}

/* A newer launch entry point libvnpu.so does not hook: what the fake AscendCL's aclrtLaunchKernel uses. */
EXPORT rtError_t rtLaunchKernelByFuncHandle(void *func, uint32_t blocks, void *stream) {
    (void)stream;
    if (!func) return PARAM_INVALID;
    return run(kernel_time(blocks));
}
