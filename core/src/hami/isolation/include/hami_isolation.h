/*
 * hami_isolation.h: the C core that every vendor's isolation library is built on.
 *
 * A vendor library (libvgpu.so for NVIDIA, ...) is a thin layer of hooks over its vendor's API. It describes
 * itself once (struct hami_iso_vendor: the names of its environment variables), and then asks the core, from
 * its hooks:
 *   - memory:  hami_iso_memory_reserve() before an allocation reaches the driver, hami_iso_memory_release()
 *              after a free did; hami_iso_memory_used()/_limit() for the queries it must answer;
 *   - tracking: hami_iso_track() / hami_iso_untrack() remember the exact size counted for a pointer or handle;
 *   - compute: hami_iso_launch_admit() before a launch (it charges the launch's estimated device time and
 *              waits while the container is over its share), hami_iso_launch_timed() with a measured device
 *              time when the core asked for one; and, where the vendor's management library can say how much
 *              device time the device itself spent on this process (NVML's per-process utilization), the
 *              vendor's device_busy() callback, by which the core holds the share when events are blurred by
 *              other containers' work (a device that time-slices contexts; limiter.c).
 * The core owns the configuration (read at every process start from the node's grant, GRANT.md, which the
 * environment may only lower; a grant expected but unreadable makes hami_iso_memory_reserve() refuse
 * everything, so a vendor library fails closed by calling it before every allocation), the accounting file
 * shared by all processes of a container (LAYOUT.md documents it), the compute limiter and logging.
 *
 * What every vendor's hooks do the same way is here too (hookkit.c): remembering and forgetting allocations,
 * the container's view for memory queries, and launches timed with the vendor's events (HAMI_ISO_LAUNCH). A vendor
 * whose driver API is CUDA's (under any prefix) writes no hooks at all: the core's CUDA-compatible hook layer
 * (cuda/, cuda/README.md) has them, and the vendor names its libraries, symbols and variables.
 *
 * Everything here is thread-safe. Nothing here calls the vendor's API: the core never loads a driver.
 * Symbols are hidden: the vendor library exports only its hooks.
 */
#ifndef HAMI_ISOLATION_H
#define HAMI_ISOLATION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Devices a container can see, at most (per-device arrays in the accounting file have this many entries). */
#define HAMI_ISO_MAX_DEVICES 16

/* ------------------------------------------------------------------------------------------------------ */
/* Start-up                                                                                                */
/* ------------------------------------------------------------------------------------------------------ */

/* What a vendor library tells the core about itself: the names of its environment variables. NULL means
 * "this vendor has no such setting". Per-device variables are the name followed by "_<index>". */
typedef struct hami_iso_vendor {
    const char *name;                /* short vendor name written into the accounting file, e.g. "nvidia" */
    const char *memory_limit_env;    /* "CUDA_DEVICE_MEMORY_LIMIT": bytes, or with a k/m/g suffix */
    const char *core_limit_env;      /* "CUDA_DEVICE_SM_LIMIT": percent of device time, 0 = unlimited */
    const char *shared_cache_env;    /* "CUDA_DEVICE_MEMORY_SHARED_CACHE": path of the accounting file */
    const char *default_cache_path;  /* used when shared_cache_env is unset */
    const char *oversubscribe_env;   /* "CUDA_OVERSUBSCRIBE": "true" reports the limit even above physical */
    const char *priority_env;        /* "CUDA_TASK_PRIORITY": 0 high, 1 (default) normal */
    const char *policy_env;          /* "GPU_CORE_UTILIZATION_POLICY": default | force | disable */
    const char *log_level_env;       /* "LIBCUDA_LOG_LEVEL": 0 errors .. 4 trace; default 1 (warnings) */
    const char *visible_devices_env; /* "NVIDIA_VISIBLE_DEVICES": device UUIDs recorded for the node daemon */
    /* Called by the limiter before it makes a launch wait: return non-zero when `stream` is being captured
     * (nothing runs now, so nothing is charged). May be NULL. */
    int (*stream_capturing)(void *stream);
    /* Called by the limiter, for one device at a time and at most every 50 ms: the device time `device` spent on
     * this process's work since the previous call, as the device itself counted it (NVML's per-process
     * utilization for a CUDA-compatible vendor), in *busy_ns; return 0, 1 when nothing new is known yet (the
     * device's figures lag: what was charged meanwhile is settled with the next answer, which covers this span
     * too), or -1 when it is not known (then, and with NULL here, the limiter relies on its event timing alone,
     * which a device that time-slices contexts blurs with other containers' work). The first call may answer -1:
     * it only marks where the next starts. */
    int (*device_busy)(int device, uint64_t *busy_ns);
    /* Called by the memory accounting when the container's shared figures contradict what this process holds, or
     * when an allocation would take the container near its limit: the device memory the driver counts on `device`
     * for the processes `host_pids` (host pids, from the node daemon's map: the container's other processes) in
     * *bytes; return 0, or -1 when the management library cannot say (then the shared figures decide). May be
     * NULL (a management library without per-process memory). */
    int (*process_memory)(int device, const unsigned *host_pids, size_t count, uint64_t *bytes);
} hami_iso_vendor;

/* Read the configuration, open (or create) the accounting file and take this process's slot in it.
 * Idempotent and thread-safe: the first call does the work, later calls return its result at once.
 * Returns 0; on trouble (unwritable file, incompatible layout) it logs why and continues with
 * process-private accounting, so the application keeps working. */
int hami_iso_init(const hami_iso_vendor *vendor);

/* Non-zero once hami_iso_init() has completed (a cheap check for hot paths). */
int hami_iso_ready(void);

/* The number of devices the driver reports (recorded for the node daemon; capped at HAMI_ISO_MAX_DEVICES). */
void hami_iso_set_device_count(int count);

/* ------------------------------------------------------------------------------------------------------ */
/* Limits, as this process read them from its environment                                                  */
/* ------------------------------------------------------------------------------------------------------ */

uint64_t hami_iso_memory_limit(int device); /* bytes; 0 = no limit */
int hami_iso_core_limit(int device);        /* percent of device time; 0 = no limit (also when disabled) */
int hami_iso_oversubscribe(void);           /* non-zero when the limit may exceed the physical memory */

/* This process's pid in the host's pid namespace, from the node daemon's map in the grant directory this process
 * took its grant from (GRANT.md, "pids"): 1 and *host_pid set when the map lists getpid() in this process's pid
 * namespace, 0 otherwise (no grant directory, no map, not listed yet). The file is checked at most every 50 ms
 * and re-read when it changed. Thread-safe. */
int hami_iso_host_pid(unsigned *host_pid);

/* ------------------------------------------------------------------------------------------------------ */
/* Memory accounting (per container, across all its processes)                                              */
/* ------------------------------------------------------------------------------------------------------ */

/* Count `bytes` on `device` if the container stays within its limit: 0 when counted, -1 when the allocation
 * must be refused (the caller returns its API's out-of-memory error). Call before the driver allocates. */
int hami_iso_memory_reserve(int device, uint64_t bytes);

/* Give back what was counted. Call after the driver freed. Never takes a counter below zero. */
void hami_iso_memory_release(int device, uint64_t bytes);

/* What the whole container has counted on `device` now. */
uint64_t hami_iso_memory_used(int device);

/* The memory the driver reserves for a process's context on `device` (the grant's `context`, GRANT.md), counted
 * once per process and device, before the driver creates the process's first context there: 1 when counted
 * now, 0 when nothing was to count (no figure, or counted before), -1 when it does not fit in the limit (the
 * caller refuses the context with its API's out-of-memory error). If the driver then fails to create the
 * context, hami_iso_context_unreserve(device, what reserve returned) gives it back. The count lasts as long as
 * the process (the accounting reclaims a dead process's memory), as the driver's reservation does. */
int hami_iso_context_reserve(int device);
void hami_iso_context_unreserve(int device, int reserved);

/* ------------------------------------------------------------------------------------------------------ */
/* Allocation tracking: pointer or handle -> what was counted for it (process-local, lock-sharded hash)      */
/* ------------------------------------------------------------------------------------------------------ */

enum hami_iso_kind {
    HAMI_ISO_POINTER = 1, /* device pointers: plain, pitched, managed, stream-ordered, pool */
    HAMI_ISO_ARRAY = 2,   /* arrays */
    HAMI_ISO_MIPMAP = 3,  /* mipmapped arrays */
    HAMI_ISO_HANDLE = 4,  /* physical allocation handles (virtual memory management) */
};

typedef struct hami_iso_allocation {
    uint64_t size;  /* bytes counted */
    uint64_t owner; /* what frees it all at once (e.g. the context), 0 for nothing */
    int32_t device;
    uint32_t kind;
} hami_iso_allocation;

/* Remember an allocation under (kind, key). Returns 0, or -1 when out of host memory (it is then uncounted:
 * the caller releases what it reserved). */
int hami_iso_track(uint32_t kind, uint64_t key, const hami_iso_allocation *allocation);

/* Forget (kind, key); returns 1 and fills `out` when it was known, 0 otherwise. */
int hami_iso_untrack(uint32_t kind, uint64_t key, hami_iso_allocation *out);

/* Forget every allocation of `owner` whose kind is in `kind_mask` (bit 1 << kind) and release their memory
 * (the owner was destroyed, the driver freed them). Returns how many there were. */
size_t hami_iso_untrack_owner(uint64_t owner, uint32_t kind_mask);

/* ------------------------------------------------------------------------------------------------------ */
/* Compute limiter                                                                                          */
/* ------------------------------------------------------------------------------------------------------ */

/* What hami_iso_launch_admit() decided about one launch. */
typedef struct hami_iso_launch {
    int32_t device;
    uint32_t estimator; /* which estimate the launch was charged from */
    uint64_t kernel;    /* the key it was estimated by */
    int64_t charged_ns; /* device time charged in advance */
} hami_iso_launch;

enum hami_iso_admit {
    HAMI_ISO_LAUNCH_GO = 0,       /* launch; nothing more to do */
    HAMI_ISO_LAUNCH_TIME = 1,     /* launch, measuring its device time if convenient; report it later */
    HAMI_ISO_LAUNCH_TIME_NOW = 2, /* launch, measure and wait for the measurement (no estimate exists yet) */
};

/* Before launching `kernel` (any stable identity of the work: a function, a graph) with `work` units (blocks)
 * on `device` through `stream`: charges the launch's estimated device time to the container and sleeps while
 * the container is over its share (CUDA_DEVICE_SM_LIMIT), or while the node daemon asked low-priority work to
 * yield. Returns one of enum hami_iso_admit and fills `launch` (needed only when it is not GO). */
int hami_iso_launch_admit(int device, uint64_t kernel, uint64_t work, void *stream, hami_iso_launch *launch);

/* Report the measured device time of a launch admitted with TIME or TIME_NOW. */
void hami_iso_launch_timed(const hami_iso_launch *launch, uint64_t device_ns);

/* ------------------------------------------------------------------------------------------------------ */
/* What every vendor's hooks do the same way (hookkit.c)                                                    */
/* ------------------------------------------------------------------------------------------------------ */

/* After the driver allocated `size` bytes that hami_iso_memory_reserve() counted: remember them under (kind, key);
 * when that fails (out of host memory) the reservation is given back, so nothing stays counted that no free finds. */
void hami_iso_remember(uint32_t kind, uint64_t key, int device, uint64_t size, uint64_t owner);

/* After the driver answered a free of (kind, key) that hami_iso_untrack() found (`known`) as `a`: release what was
 * counted when the free succeeded (`freed` non-zero), else remember it again (the memory is still held). */
void hami_iso_forgotten(uint32_t kind, uint64_t key, int known, const hami_iso_allocation *a, int freed);

/* The container's view of `device`'s memory, from the driver's physical numbers (updated in place): total =
 * min(limit, physical) (the limit itself when oversubscribing), free = min(total - used, physical free), never
 * below zero; `used` (may be NULL) = what the container counted. Returns 0 and changes nothing without a limit.
 * `free` may be NULL (a total-only query). */
int hami_iso_memory_view(int device, uint64_t *total, uint64_t *free, uint64_t *used);

/* The same for the common (size_t *free, size_t *total) query; `free` may be NULL. Returns what the above does. */
int hami_iso_memory_view_sizes(int device, size_t *free, size_t *total);

/* Timing launches with the vendor's events, for the limiter's measurements (HAMI_ISO_LAUNCH_TIME[_NOW]). The
 * vendor adapts its event API to this table (each function returns 0 on success, like the APIs themselves). Every
 * thread keeps HAMI_ISO_TIMINGS event pairs, created on first use and again when the thread's `owner` (its device,
 * or its context where events belong to one) changes, so that a measurement waiting behind a deep queue does not
 * keep the next kinds of work from being measured. */
typedef struct hami_iso_events {
    const char *api;                                      /* for messages: "hipEvent", "cuEvent", ... */
    int (*create)(void **event);
    void (*destroy)(void *event);
    int (*record)(void *event, void *stream);
    int (*query)(void *event);                            /* 0 once the device got past the event */
    int (*elapsed_ms)(float *ms, void *start, void *end);
    int (*synchronize)(void *event);
    int (*capturing)(void *stream);                       /* optional: non-zero = never add events to `stream` */
} hami_iso_events;

#define HAMI_ISO_TIMINGS 8

typedef struct hami_iso_timing hami_iso_timing;

/* Before a launch the limiter wants timed: records a free pair's start event on `stream`; returns the pair, or
 * NULL when this launch is not timed (no event API, every pair still waiting for the device, a captured stream). */
hami_iso_timing *hami_iso_time_begin(const hami_iso_events *events, uint64_t owner, void *stream);

/* After the launch: records the end event (when `launched` is 0, the API's success) and, for TIME_NOW, waits for
 * it and reports the measurement at once; otherwise a later hami_iso_time_begin() of the thread reports it. */
void hami_iso_time_end(const hami_iso_events *events, hami_iso_timing *timing, int decision, void *stream,
                       int launched, const hami_iso_launch *launch);

/* The body of a launch hook, after the vendor's entry checks: admit the launch (`kernel`, `work` units on `device`
 * through `stream`), make the real call (`call`, an expression of type `result_type`; 0 is success), time it when
 * the limiter asks (`owner` as for hami_iso_time_begin), and return its result. */
#define HAMI_ISO_LAUNCH(events, device, owner, kernel, work, stream, result_type, call)                          \
    do {                                                                                                       \
        hami_iso_launch launch_;                                                                               \
        int decision_ = hami_iso_launch_admit((device), (uint64_t)(uintptr_t)(kernel), (work),                 \
                                              (void *)(stream), &launch_);                                     \
        if (__builtin_expect(decision_ == HAMI_ISO_LAUNCH_GO, 1)) return call;                                 \
        hami_iso_timing *timing_ = hami_iso_time_begin((events), (owner), (void *)(stream));                  \
        result_type r_ = call;                                                                                 \
        hami_iso_time_end((events), timing_, decision_, (void *)(stream), (int)r_, &launch_);                 \
        return r_;                                                                                             \
    } while (0)

/* ------------------------------------------------------------------------------------------------------ */
/* Lookups (lookup.c): the core defines dlvsym, dlopen and dlmopen; a vendor exports them (its version script)  */
/* ------------------------------------------------------------------------------------------------------ */

/* Provided by the vendor library (optional, a weak reference here): its hook table, by name: its hook for
 * `name`, or NULL. The core's dlsym (where the real one finds the name) and dlvsym (any version string) answer it
 * (lookup.c); the vendor's version script exports `dlsym; dlvsym; dlopen; dlmopen;`. */
void *hami_iso_hook_for_symbol(const char *name);

/* One entry of a hook table written as an X-macro list: `HAMI_HOOKS(HAMI_ISO_HOOK_MATCH)` inside
 * hami_iso_hook_for_symbol(const char *name) (string.h included) answers each listed hook by its name. */
#define HAMI_ISO_HOOK_MATCH(hook)                                                                              \
    if (!strcmp(name, #hook)) return (void *)&hook;

/* The hook for `name`: the core's own for dlsym, dlvsym, dlopen and dlmopen, else hami_iso_hook_for_symbol's. */
void *hami_iso_lookup_hook(const char *name);

/* The real dlsym (libc's), or NULL: for the library's own lookups of the real functions it wraps (a plain dlsym
 * call inside the library is the core's, which answers hooks). */
typedef void *(*hami_iso_dlsym_fn)(void *handle, const char *name);
hami_iso_dlsym_fn hami_iso_real_dlsym(void);

/* `name` (a function) from libc's own symbol table, at its default version: the real dlsym, whatever
 * interposes it (never ask dlsym or dlvsym for it: in this library they are ours). */
void *hami_iso_libc_symbol(const char *name);

/* ------------------------------------------------------------------------------------------------------ */
/* The vendor's libraries (objects.c), for hooks that resolve their real functions themselves              */
/* ------------------------------------------------------------------------------------------------------ */

/* The real `name`: the next definition after the isolation library (dlsym(RTLD_NEXT), so another interposer
 * comes first), else from the first of `names` (`count` library names or paths) that is loaded or loads; the
 * library found is kept in *library for the next names. NULL when none has it. */
void *hami_iso_resolve(void **library, const char *const *names, size_t count, const char *name);

/* The mapped address range [*lo, *hi) of the loaded object holding `probe` (all its PT_LOAD segments), for the
 * "called from inside the vendor's library" check of hooks; left unchanged when `probe` is NULL or unknown. */
void hami_iso_object_range(const void *probe, uintptr_t *lo, uintptr_t *hi);

/* ------------------------------------------------------------------------------------------------------ */
/* Logging                                                                                                  */
/* ------------------------------------------------------------------------------------------------------ */

enum hami_log_level {
    HAMI_LOG_ERROR = 0,
    HAMI_LOG_WARN = 1,
    HAMI_LOG_INFO = 2,
    HAMI_LOG_DEBUG = 3,
    HAMI_LOG_TRACE = 4,
};

extern int hami_log_level; /* from the vendor's log level variable; HAMI_LOG_WARN until read */

void hami_log(int level, const char *format, ...) __attribute__((format(printf, 2, 3)));

#define HAMI_LOG(level, ...)                                                                                 \
    do {                                                                                                       \
        if ((level) <= hami_log_level) hami_log((level), __VA_ARGS__);                                         \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif /* HAMI_ISOLATION_H */
