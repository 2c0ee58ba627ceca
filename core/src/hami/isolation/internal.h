/*
 * internal.h: what the core's sources share and vendors never see: the accounting file's layout (LAYOUT.md
 * documents the same offsets for readers in other languages; the _Static_asserts below keep them honest), the
 * process's own state, and small helpers (clocks, CPU relax).
 */
#ifndef HAMI_ISOLATION_INTERNAL_H
#define HAMI_ISOLATION_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "hami_isolation.h"

/* ------------------------------------------------------------------------------------------------------ */
/* The accounting file (version 1)                                                                          */
/* ------------------------------------------------------------------------------------------------------ */

#define HAMI_REGION_MAGIC 0x54434341494d4148ULL /* the bytes "HAMIACCT" read as a little-endian u64 */
#define HAMI_REGION_VERSION 1u
#define HAMI_REGION_HEADER_SIZE 8192u
#define HAMI_REGION_SLOT_SIZE 1024u
#define HAMI_REGION_SLOTS 1024u
#define HAMI_REGION_SIZE (HAMI_REGION_HEADER_SIZE + HAMI_REGION_SLOTS * HAMI_REGION_SLOT_SIZE)

enum { HAMI_POLICY_DEFAULT = 0, HAMI_POLICY_FORCE = 1, HAMI_POLICY_DISABLE = 2 };
enum { HAMI_CONTROL_NONE = 0, HAMI_CONTROL_LIFT = 1, HAMI_CONTROL_YIELD = 2 };
enum { HAMI_SLOT_FREE = 0, HAMI_SLOT_ACTIVE = 1 };

/* One device, in the header: 256 bytes, four cache lines (memory, limiter, control and statistics, uuid). */
struct hami_region_device {
    /* line 0: memory, changed under the region lock */
    _Atomic uint64_t memory_used;  /*   0: bytes counted by every live process of the container */
    uint64_t memory_limit;         /*   8: bytes, 0 = none (as the last process to start read it) */
    _Atomic uint64_t memory_peak;  /*  16: highest memory_used seen */
    _Atomic uint64_t tampered;     /*  24: times a process found the figures lowered behind its back */
    _Atomic uint64_t tampered_ns;  /*  32: CLOCK_REALTIME of the last time */
    uint8_t pad0[24];
    /* line 1: the compute limiter's token bucket, lock-free */
    _Atomic int64_t tokens_ns;     /*  64: device time the container may still use; negative = in debt */
    _Atomic uint64_t refill_ns;    /*  72: CLOCK_MONOTONIC of the last refill */
    uint32_t core_limit;           /*  80: percent, 0 = none */
    uint32_t policy;               /*  84: 0 default, 1 force, 2 disable */
    uint8_t pad1[40];
    /* line 2: what the node daemon writes, and statistics */
    _Atomic uint32_t control_mode; /* 128: 0 none, 1 lift the limit, 2 low priority yields */
    uint32_t pad2;
    _Atomic uint64_t control_until_ns; /* 136: CLOCK_REALTIME until which control_mode holds */
    _Atomic uint64_t last_kernel_ns;   /* 144: CLOCK_REALTIME of a recent launch */
    _Atomic uint64_t launches;         /* 152: kernel launches (flushed in batches) */
    _Atomic uint64_t device_time_ns;   /* 160: device time charged to the container */
    uint8_t pad3[24];
    /* line 3 */
    char uuid[64]; /* 192: NUL-terminated, from the vendor's visible-devices variable when it names UUIDs */
};

struct hami_region_header {
    uint64_t magic;          /*   0 */
    uint32_t version;        /*   8 */
    uint32_t header_size;    /*  12 */
    uint32_t slot_size;      /*  16 */
    uint32_t slot_count;     /*  20 */
    uint32_t device_slots;   /*  24: HAMI_ISO_MAX_DEVICES */
    _Atomic uint32_t device_count; /* 28: devices the driver reported */
    uint64_t created_ns;     /*  32: CLOCK_REALTIME */
    _Atomic uint64_t updated_ns; /* 40: CLOCK_REALTIME of the last process start */
    _Atomic uint32_t slot_hwm;   /* 48: slots at or above this index were never used */
    _Atomic uint32_t processes;  /* 52: slots in use */
    uint32_t priority;       /*  56: CUDA_TASK_PRIORITY of the last process to start */
    uint32_t flags;          /*  60: bit 0 oversubscribe */
    char vendor[16];         /*  64 */
    uint8_t pad0[176];
    union {                  /* 256: robust, process-shared; its first 4 bytes hold the owner's thread id */
        pthread_mutex_t mutex;
        uint8_t bytes[128];
    } lock;
    uint8_t pad1[640];
    struct hami_region_device devices[HAMI_ISO_MAX_DEVICES]; /* 1024 */
    uint8_t pad2[HAMI_REGION_HEADER_SIZE - 1024 - HAMI_ISO_MAX_DEVICES * 256];
};

struct hami_slot_device {
    _Atomic uint64_t memory_used;    /* 0: bytes this process holds (changed under the lock) */
    _Atomic uint64_t launches;       /* 8 */
    _Atomic uint64_t device_time_ns; /* 16 */
    _Atomic uint64_t last_kernel_ns; /* 24: CLOCK_REALTIME */
};

struct hami_region_slot {
    _Atomic int32_t pid;       /*  0: 0 = free; the process id in the container's pid namespace */
    _Atomic uint32_t state;    /*  4 */
    uint64_t start_time;       /*  8: the process's start time in clock ticks after boot (/proc/<pid>/stat) */
    int32_t priority;          /* 16 */
    uint32_t flags;            /* 20 */
    uint64_t registered_ns;    /* 24: CLOCK_REALTIME when the slot was taken */
    uint8_t pad0[32];
    struct hami_slot_device devices[HAMI_ISO_MAX_DEVICES]; /* 64 */
    uint8_t pad1[HAMI_REGION_SLOT_SIZE - 64 - HAMI_ISO_MAX_DEVICES * 32];
};

_Static_assert(sizeof(struct hami_region_device) == 256, "device record is 256 bytes");
_Static_assert(offsetof(struct hami_region_device, tampered) == 24, "layout");
_Static_assert(offsetof(struct hami_region_device, tokens_ns) == 64, "layout");
_Static_assert(offsetof(struct hami_region_device, control_mode) == 128, "layout");
_Static_assert(offsetof(struct hami_region_device, device_time_ns) == 160, "layout");
_Static_assert(offsetof(struct hami_region_device, uuid) == 192, "layout");
_Static_assert(sizeof(struct hami_region_header) == HAMI_REGION_HEADER_SIZE, "header size");
_Static_assert(offsetof(struct hami_region_header, vendor) == 64, "layout");
_Static_assert(offsetof(struct hami_region_header, lock) == 256, "layout");
_Static_assert(offsetof(struct hami_region_header, devices) == 1024, "layout");
_Static_assert(sizeof(pthread_mutex_t) <= 128, "the lock fits its 128 bytes");
_Static_assert(sizeof(struct hami_region_slot) == HAMI_REGION_SLOT_SIZE, "slot size");
_Static_assert(offsetof(struct hami_region_slot, devices) == 64, "layout");
_Static_assert(sizeof(_Atomic uint64_t) == 8 && sizeof(_Atomic int32_t) == 4, "plain-sized atomics");

/* ------------------------------------------------------------------------------------------------------ */
/* This process                                                                                             */
/* ------------------------------------------------------------------------------------------------------ */

struct hami_estimate {       /* one entry of a direct-mapped cache: kernel key -> device time (limiter.c) */
    _Atomic uint64_t key;
    _Atomic int64_t ns;
    _Atomic int64_t recent[2];  /* its last two measurements, newest first (while new: its lowest) */
    _Atomic uint32_t samples;   /* measurements of it so far (counted up to limiter.c's ESTIMATE_YOUNG) */
    uint8_t pad[28];
};

_Static_assert(sizeof(struct hami_estimate) == 64, "an estimate is one cache line");

#define HAMI_ESTIMATES 256

struct hami_process_device {
    uint64_t memory_limit; /* 0 = none */
    uint64_t own_bytes;    /* what this process counted on the device and holds (its own memory, not the file's;
                            * changed under the region lock) */
    uint64_t others_ns;    /* CLOCK_MONOTONIC of the last question to the driver about the container's others */
    int core_limit;        /* percent, 0 = none */
    int limited;           /* core limit in force (set, and the policy does not disable it) */
    int64_t burst_ns;      /* most device time the bucket holds */
    struct hami_control *control; /* the node daemon's control words for this device (hami_control_of) */
    _Atomic int64_t fallback_ns; /* average device time of a launch, for kernels without an estimate */
    _Atomic int measured;        /* a launch was timed on this device */
    _Atomic int64_t charged_ns;  /* device time this process's launches were charged (flushed per thread) */
    _Atomic uint64_t busy_poll_ns; /* CLOCK_MONOTONIC of the last question to the vendor's device_busy */
    int64_t charged_seen;          /* charged_ns then */
    _Atomic int busy_known;        /* the last answer was known: the device's count holds the share, not events */
    int64_t window_real, window_charged; /* since `scale` last moved */
    uint64_t window_from_ns;       /* CLOCK_MONOTONIC at which that window starts (0: answers unknown) */
    int64_t owed_ns;               /* what the device counted beyond the charges, not paid into the bucket yet */
    uint64_t settled_ns;           /* CLOCK_MONOTONIC of the last answer paid in (0: none since unknown) */
    _Atomic uint32_t scale;        /* 16.16: what the device counted per ns the events measured (0: 1.0) */
    _Alignas(64) struct hami_estimate estimates[HAMI_ESTIMATES];
};

struct hami_process {
    const hami_iso_vendor *vendor;
    struct hami_region_header *header;
    struct hami_region_slot *slots;
    struct hami_region_slot *slot; /* ours; NULL until taken, or when none could be had */
    struct hami_region_slot private_slot; /* used when the shared file has no room */
    int shared;                    /* the region is the container's file, not process-private memory */
    int32_t pid;
    uint64_t start_time;
    int priority;
    int policy;
    int oversubscribe;
    _Atomic int exiting;
    uint64_t context_bytes;        /* counted once per device when the process's first context comes up */
    _Atomic uint32_t context_counted; /* devices (bit i) whose context this process has counted */
    int granted;                   /* the limits come from the node's grant (the environment only lowered them) */
    int fail_closed;               /* a grant was expected and could not be read: every allocation is refused */
    char *control;                 /* the first device's control words (struct hami_control) */
    size_t control_stride;         /* bytes from one device's control words to the next */
    uint32_t test_lock_hold_us;    /* HAMI_ISOLATION_TEST_LOCK_HOLD_US: tests kill processes inside the lock */
    _Atomic uint64_t last_cheap_reclaim_ns;
    _Atomic uint64_t last_full_reclaim_ns;
    struct hami_process_device devices[HAMI_ISO_MAX_DEVICES];
};

extern struct hami_process hami_proc;

/* The host pids the node daemon's map (GRANT.md "pids") lists for this container, at most `max`, leaving out
 * `except` (this process's): how many; -1 without a grant directory or a map there. */
int hami_grant_container_host_pids(unsigned *out, int max, unsigned except);

static inline struct hami_control *hami_control_of(struct hami_process *p, int device) {
    return (struct hami_control *)(p->control + (size_t)device * p->control_stride);
}

/* The node daemon's control words for one device: in the accounting file's device record (offset 128) for a
 * process without a grant, else in <grant dir>/<vendor>.control, 16 bytes per device, which the container can
 * only read (GRANT.md): a process cannot lift its own compute limit by writing them. */
struct hami_control {
    _Atomic uint32_t mode;     /* HAMI_CONTROL_* */
    uint32_t pad;
    _Atomic uint64_t until_ns; /* CLOCK_REALTIME until which mode holds */
};
_Static_assert(sizeof(struct hami_control) == 16, "a control record is 16 bytes");
_Static_assert(offsetof(struct hami_region_device, control_until_ns) ==
                   offsetof(struct hami_region_device, control_mode) + 8, "the accounting file's control words");

/* grant.c: the limits the node daemon granted (GRANT.md) */
#ifndef HAMI_ISO_GRANT_DIR
#define HAMI_ISO_GRANT_DIR "/etc/hami/grant"
#endif

struct hami_grant {
    int devices; /* devices listed (0 .. devices-1) */
    int policy;
    int priority;
    int oversubscribe;
    uint64_t context_bytes; /* what the driver reserves per process and device for its context */
    uint64_t memory_limit[HAMI_ISO_MAX_DEVICES]; /* bytes, 0 = the whole device */
    int core_limit[HAMI_ISO_MAX_DEVICES];        /* percent, 0 or 100 = the whole device */
    char uuid[HAMI_ISO_MAX_DEVICES][64];
};

/* 1 and `grant` filled when a grant was read; 0 when none is expected; -1 (`why` filled) when one is expected
 * and missing or malformed: the caller fails closed. */
int hami_grant_load(const hami_iso_vendor *vendor, struct hami_grant *grant, char *why, size_t size);
int hami_grant_parse(char *text, struct hami_grant *grant, char *why, size_t size);
/* The read-only mapping of <grant dir>/<vendor>.control (HAMI_ISO_MAX_DEVICES records), NULL when absent. */
struct hami_control *hami_grant_control(const hami_iso_vendor *vendor);

/* config.c */
void hami_config_read(const hami_iso_vendor *vendor, struct hami_process *proc);
int hami_parse_size(const char *text, uint64_t *bytes);
const char *hami_env_device(const char *name, int device, char *buffer, size_t size);

/* region.c */
int hami_region_open(struct hami_process *proc, const char *path);
void hami_region_publish_limits(struct hami_process *proc);
void hami_region_take_slot(struct hami_process *proc);
void hami_region_leave(struct hami_process *proc);
void hami_region_after_fork(struct hami_process *proc);
void hami_slot_add_launches(int device, uint64_t launches, uint64_t device_ns);
uint64_t hami_process_start_time(int32_t pid);

/* track.c */
void hami_track_reset(void);

/* log.c */
void hami_log_set_vendor(const char *name);

/* ------------------------------------------------------------------------------------------------------ */
/* Helpers                                                                                                  */
/* ------------------------------------------------------------------------------------------------------ */

static inline uint64_t hami_clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t hami_mono_ns(void) { return hami_clock_ns(CLOCK_MONOTONIC); }
static inline uint64_t hami_wall_ns(void) { return hami_clock_ns(CLOCK_REALTIME); }
static inline uint64_t hami_coarse_wall_ns(void) { return hami_clock_ns(CLOCK_REALTIME_COARSE); }
static inline uint64_t hami_coarse_mono_ns(void) { return hami_clock_ns(CLOCK_MONOTONIC_COARSE); }

static inline void hami_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Subtract without going below zero; returns what was really subtracted. */
static inline uint64_t hami_sub_floor(_Atomic uint64_t *counter, uint64_t amount) {
    uint64_t now = atomic_load_explicit(counter, memory_order_relaxed);
    for (;;) {
        uint64_t take = amount < now ? amount : now;
        if (atomic_compare_exchange_weak_explicit(counter, &now, now - take, memory_order_relaxed,
                                                  memory_order_relaxed))
            return take;
    }
}

#define HAMI_LIKELY(x) __builtin_expect(!!(x), 1)
#define HAMI_UNLIKELY(x) __builtin_expect(!!(x), 0)

#endif /* HAMI_ISOLATION_INTERNAL_H */
