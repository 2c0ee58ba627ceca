/*
 * fake_device.h: the "hardware" under a vendor's fake driver in the isolation tests (fake_device.c implements it
 * and is compiled into each fake library that needs it). It owns what every fake shares and nothing of any API:
 * the fake library defines the vendor's functions, argument conventions and error codes on top of these.
 *
 * The hardware lives in one state file shared by every process of a test (hami.testing.sandbox creates it
 * zero-filled, FAKE_STATE_SIZE bytes, and reads it with the offsets below); without it each process has its own.
 * For each device: what is really allocated now and its peak, and a timeline of device work that runs one thing at
 * a time in the order it was queued, with the device time credited to the launching process's tag, and the
 * stretches of that timeline each process's work occupied (the last FAKE_RUNS of them, by process id: what the
 * fake NVML's per-process utilization is computed from, as a driver's is from what the device ran).
 *
 * Configuration, read by fake_device_load from variables named by the fake's prefix P (for example "FAKE_X_"):
 *   P DEVICES (default 1), P MEMORY (bytes per device, k/m/g suffix), P KERNEL_NS and P KERNEL_NS_PER_BLOCK (the
 *   time of a launch: fake_kernel_ns), P QUEUE_NS (default 20 ms: a launch waits, before it is queued, while the
 *   process has more of its own work queued, as a full command buffer does; other processes' work does not
 *   count), P TAG (0-7), P NO_BACKING=1 (allocations keep only a small header, for benchmarks), P STATE,
 *   P CONTEXT_MIB (what each process's context reserves on a device: fake_context_up),
 *   P EVENT_TIMING: "device" (the default) or "queued". By default an event recorded now is reached when the
 *   device gets past everything queued before it, every process's work included, so a pair of events around a
 *   launch times the launch (and only what others queued between the two records). With "queued" an event is
 *   reached when this process's own earlier work is done, as on a device that time-slices contexts: a launch
 *   queued behind another process's work then measures that work too (the "blurred" timing of a busy device).
 * On a normal exit the process's counted allocations are given back (a driver frees a dead process's memory).
 * What each process holds per device is kept in the state too (by its host pid: fake_process_memory), for a fake
 * management library's per-process list.
 */
#ifndef HAMI_FAKE_DEVICE_H
#define HAMI_FAKE_DEVICE_H

#include <stdatomic.h>
#include <stdint.h>

#define FAKE_MAX_DEVICES 8
#define FAKE_TAGS 8
#define FAKE_RUNS 2048 /* executed intervals kept per device, for the fake NVML's per-process utilization */
#define FAKE_STATE_SIZE (4096 + FAKE_MAX_DEVICES * (32 + FAKE_RUNS * 32))

struct fake_device_state {                   /* 256 bytes */
    _Atomic uint64_t allocated;              /*   0: bytes really allocated now, by every process */
    _Atomic uint64_t peak;                   /*   8: highest `allocated` ever */
    _Atomic uint64_t busy_until;             /*  16: CLOCK_MONOTONIC ns at which queued work ends */
    _Atomic uint64_t launches;               /*  24: launches that ran for a time */
    _Atomic uint64_t busy_ns[FAKE_TAGS];     /*  32: device time of launches, by the launcher's tag */
    _Atomic uint64_t allocations;            /*  96: successful device allocations */
    _Atomic uint64_t host_allocations;       /* 104: host allocations (never counted as device memory) */
    uint8_t pad[144];
};

/* One stretch of a device's timeline spent on one process's work: [start_ns, end_ns) CLOCK_MONOTONIC. A launch that
 * follows the same process's previous one on the timeline extends its record. `seq` is odd while it is written. */
struct fake_run_record {
    _Atomic uint64_t seq;
    _Atomic int64_t pid;
    _Atomic uint64_t start_ns;
    _Atomic uint64_t end_ns;
};

struct fake_runs {
    _Atomic uint64_t next;  /* records taken so far; record i is at i % FAKE_RUNS */
    uint8_t pad[24];
    struct fake_run_record records[FAKE_RUNS];
};

/* What one process holds on one device, as a driver counts it per process (the fake NVML's process list). */
struct fake_process_memory {
    _Atomic int32_t pid;    /* the driver's pid (the host's); 0 = free */
    _Atomic int32_t device;
    _Atomic uint64_t bytes;
};

#define FAKE_PROCESS_ENTRIES 96

struct fake_state {
    uint8_t header[256];
    struct fake_device_state devices[FAKE_MAX_DEVICES]; /* at 256 */
    struct fake_process_memory processes[FAKE_PROCESS_ENTRIES]; /* at 2304: (pid, device) -> bytes held */
    uint8_t pad[4096 - 256 - FAKE_MAX_DEVICES * 256 - FAKE_PROCESS_ENTRIES * 16];
    struct fake_runs runs[FAKE_MAX_DEVICES]; /* at 4096: what each device executed, for whom (fake_busy_ns) */
};

_Static_assert(sizeof(struct fake_device_state) == 256, "fake device state is 256 bytes");
_Static_assert(sizeof(struct fake_runs) == 32 + FAKE_RUNS * 32, "run records are 32 bytes");
_Static_assert(sizeof(struct fake_state) == FAKE_STATE_SIZE, "the file's size");

struct fake_config {
    int devices;       /* P DEVICES, at most FAKE_MAX_DEVICES */
    uint64_t memory;   /* P MEMORY: bytes per device */
    int tag;           /* P TAG: whose device time this process's launches are */
};

extern struct fake_config fake;          /* set by fake_device_load */
extern struct fake_state *fake_state;    /* the shared state (this process's own without P STATE) */

/* Read the configuration from the variables of `prefix` (MEMORY defaults to `default_memory`) and map the state
 * file. Call it first, from the fake library's constructor. */
void fake_device_load(const char *prefix, uint64_t default_memory);

/* The fake's variable `name` (after its prefix) as a number with an optional k/m/g suffix; `fallback` when unset. */
uint64_t fake_env(const char *name, uint64_t fallback);

/* ---- memory ---------------------------------------------------------------------------------------------- */

/* A new allocation of `size` bytes on `device`, counted as device memory when `counted` (else it is a host
 * allocation); NULL when the device has not that much free. */
void *fake_alloc(int device, uint64_t size, int counted);

/* Free what fake_alloc returned: 1, or 0 when `p` is not a live allocation (NULL included). */
int fake_free(void *p);

/* Free every counted allocation of this process on `device`, as a device or context reset does. */
void fake_reset_device(int device);

/* The memory this process's context reserves on `device` (P CONTEXT_MIB MiB, default 0), taken once per process
 * and device when its first context there comes up and given back when the process ends, as a driver does: 1
 * when the context may come up, 0 when the device has not that much free (the driver's out-of-memory). It is
 * device memory like any other: in fake_used, the memory queries and the state file's `allocated`. */
int fake_context_up(int device);

/* Bytes really allocated on `device` now, by every process. */
uint64_t fake_used(int device);

/* The processes holding memory on `device` (by the driver's pid, the host's), at most `max`: how many were written
 * to pids[]/bytes[]; *total is how many there are (a process that died without exiting is left out). */
unsigned fake_process_memory(int device, int64_t *pids, uint64_t *bytes, unsigned max, unsigned *total);

/* ---- time ------------------------------------------------------------------------------------------------ */

uint64_t fake_now_ns(void);
void fake_sleep_until(uint64_t t);

/* Device time of a kernel of `blocks` blocks: P KERNEL_NS + P KERNEL_NS_PER_BLOCK x blocks. */
uint64_t fake_kernel_ns(uint64_t blocks);

/* Queue `duration` ns of work (0: nothing) on `device`'s timeline for this process, waiting first while the
 * process's own queue is full; credited to its tag. */
void fake_run(int device, uint64_t duration);

/* When `device` reaches work queued now: the time at which an event recorded now completes (P EVENT_TIMING). */
uint64_t fake_reached(int device);

/* Sleep until this process's queued work is done. */
void fake_synchronize(void);

/* Device time `device` spent on process `pid`'s work within [from_ns, to_ns) (CLOCK_MONOTONIC), from the runs it
 * executed; *covered_from is set to the start of the span the records still cover (later than from_ns when older
 * records were overwritten: the answer is then for [*covered_from, to_ns)). */
uint64_t fake_busy_ns(int device, int64_t pid, uint64_t from_ns, uint64_t to_ns, uint64_t *covered_from);

#endif
