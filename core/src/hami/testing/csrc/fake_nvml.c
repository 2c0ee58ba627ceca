/*
 * fake_nvml.c: the minimal fake NVML-compatible management library a CUDA-compatible vendor's isolation tests
 * need (NVML's names: libnvidia-ml.so.1, or a compatible library such as an ixML): device count, handles, indices
 * and the memory query, over the same fake hardware as fake_cuda.c (fake_device.c with the FAKE_CUDA_ variables:
 * FAKE_CUDA_DEVICES, FAKE_CUDA_MEMORY, and what is used from FAKE_CUDA_STATE). Not a discovery fake: this one only
 * answers memory questions and per-process utilization.
 *
 * nvmlDeviceGetProcessUtilization: NVML documents samples of each process's utilization "since
 * lastSeenTimeStamp" (a CPU timestamp in microseconds, CLOCK_REALTIME; 0: as far back as the records go), each
 * with its own CPU timestamp, over a sampling period the driver chooses; what span one sample's smUtil covers it
 * leaves open. FAKE_CUDA_NVML_SAMPLES picks one of the readings it allows, each computed from the stretches of the
 * timeline the fake device ran for each process id (fake_busy_ns):
 *   "since" (the default): one sample per process that used the device since lastSeenTimeStamp, smUtil the percent
 *            of that span the device spent on its work, timeStamp now;
 *   "second": one sample per process that used the device in the last second, smUtil the percent of the last
 *            second (whatever lastSeenTimeStamp says), timeStamp now;
 *   "periodic": the driver samples every FAKE_CUDA_NVML_PERIOD_NS (default 166 ms) on its own clock and keeps the
 *            last 8 periods: one sample per process and finished period it used the device in, smUtil the percent
 *            of that period, timeStamp the period's end, every such sample stamped after lastSeenTimeStamp (so
 *            several per process, in no particular order: newest first);
 *   "stray": as "periodic", with two samples per process no reading can place, smUtil 100: one stamped at
 *            lastSeenTimeStamp itself, one an hour ahead (a buffer replayed, another clock).
 * smUtil is rounded. A NULL buffer (or one too small: NVML_ERROR_INSUFFICIENT_SIZE) asks how many samples there
 * are; none is NVML_ERROR_NOT_FOUND. memUtil, encUtil and decUtil are 0.
 */
#define _GNU_SOURCE
#include "fake_device.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
struct device {
    unsigned index;
};
struct memory {
    unsigned long long total, free, used;
};
struct memory_v2 {
    unsigned version;
    unsigned long long total, reserved, free, used;
};

static struct device g_devices[FAKE_MAX_DEVICES];
static int g_initialized;

__attribute__((constructor)) static void load(void) {
    fake_device_load("FAKE_CUDA_", 16ull << 30);
    for (unsigned i = 0; i < FAKE_MAX_DEVICES; i++) g_devices[i].index = i;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) {
    g_initialized = 1;
    return 0;
}

EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    g_initialized = 0;
    return 0;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) { return r ? "fake NVML error" : "Success"; }

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    if (!g_initialized) return 1; /* NVML_ERROR_UNINITIALIZED */
    if (!count) return 2;
    *count = (unsigned)fake.devices;
    return 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, struct device **device) {
    if (!g_initialized) return 1;
    if (!device || index >= (unsigned)fake.devices) return 2;
    *device = &g_devices[index];
    return 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(struct device *device, unsigned *index) {
    if (!device || !index) return 2;
    *index = device->index;
    return 0;
}

static int fill(struct device *device, unsigned long long *total, unsigned long long *free,
                unsigned long long *used) {
    if (!g_initialized) return 1;
    if (!device) return 2;
    unsigned long long allocated = fake_used((int)device->index);
    *total = fake.memory;
    *used = allocated;
    *free = allocated > fake.memory ? 0 : fake.memory - allocated;
    return 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(struct device *device, struct memory *m) {
    if (!m) return 2;
    return fill(device, &m->total, &m->free, &m->used);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(struct device *device, struct memory_v2 *m) {
    if (!m) return 2;
    m->reserved = 0;
    return fill(device, &m->total, &m->free, &m->used);
}

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp; /* CPU timestamp, microseconds */
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

static uint64_t realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

enum { SAMPLES_SINCE, SAMPLES_SECOND, SAMPLES_PERIODIC, SAMPLES_STRAY };
#define PERIODS_KEPT 8

static int sample_shape(uint64_t *period) {
    const char *shape = getenv("FAKE_CUDA_NVML_SAMPLES");
    *period = fake_env("NVML_PERIOD_NS", 166000000ull);
    if (!*period) *period = 166000000ull;
    if (shape && !strcmp(shape, "second")) return SAMPLES_SECOND;
    if (shape && !strcmp(shape, "periodic")) return SAMPLES_PERIODIC;
    if (shape && !strcmp(shape, "stray")) return SAMPLES_STRAY;
    return SAMPLES_SINCE;
}

/* The processes whose work `device` ran within [from, to) (CLOCK_MONOTONIC), each once; how many. */
static unsigned ran_within(int index, uint64_t from, uint64_t to, int64_t pids[FAKE_RUNS]) {
    unsigned count = 0;
    const struct fake_runs *runs = &fake_state->runs[index];
    for (unsigned i = 0; i < FAKE_RUNS; i++) {
        const struct fake_run_record *r = &runs->records[i];
        if (!atomic_load(&r->seq) || atomic_load(&r->end_ns) <= from || atomic_load(&r->start_ns) >= to) continue;
        int64_t pid = atomic_load(&r->pid);
        unsigned j = 0;
        while (j < count && pids[j] != pid) j++;
        if (j == count) pids[count++] = pid;
    }
    return count;
}

static unsigned percent(uint64_t busy, uint64_t span) { return (unsigned)((busy * 100u + span / 2) / span); }

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(struct device *device, nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp) {
    if (!g_initialized) return 1;
    if (!device || !processSamplesCount) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    int index = (int)device->index;
    uint64_t wall = realtime_ns(), now = fake_now_ns(), period;
    int shape = sample_shape(&period);
    uint64_t seen = (uint64_t)lastSeenTimeStamp * 1000ull; /* as CLOCK_MONOTONIC: */
    uint64_t from = seen >= wall ? now : now - (wall - seen < now ? wall - seen : now);
    if (shape == SAMPLES_SECOND) from = now > 1000000000ull ? now - 1000000000ull : 0;
    nvmlProcessUtilizationSample_t *found = malloc(FAKE_RUNS * sizeof *found);
    int64_t *pids = malloc(FAKE_RUNS * sizeof *pids);
    if (!found || !pids) {
        free(found);
        free(pids);
        return 999; /* NVML_ERROR_UNKNOWN */
    }
    unsigned count = 0;
    if (shape == SAMPLES_PERIODIC || shape == SAMPLES_STRAY) {
        uint64_t last_end = now / period * period; /* the newest finished period ends here */
        for (unsigned k = 0; k < PERIODS_KEPT && last_end >= period * (k + 1); k++) {
            uint64_t end = last_end - period * k, start = end - period;
            uint64_t stamp = wall - (now - end);
            if (stamp / 1000ull <= lastSeenTimeStamp) break;
            unsigned n = ran_within(index, start, end, pids);
            for (unsigned j = 0; j < n && count < FAKE_RUNS; j++)
                found[count++] = (nvmlProcessUtilizationSample_t){
                    .pid = (unsigned)pids[j],
                    .timeStamp = stamp / 1000ull,
                    .smUtil = percent(fake_busy_ns(index, pids[j], start, end, NULL), period),
                };
        }
        unsigned real = count;
        for (unsigned j = 0; shape == SAMPLES_STRAY && j < real && count + 2 <= FAKE_RUNS; j++) {
            found[count++] = (nvmlProcessUtilizationSample_t){
                .pid = found[j].pid, .timeStamp = lastSeenTimeStamp, .smUtil = 100};
            found[count++] = (nvmlProcessUtilizationSample_t){
                .pid = found[j].pid, .timeStamp = wall / 1000ull + 3600000000ull, .smUtil = 100};
        }
    } else {
        unsigned n = ran_within(index, from, now, pids);
        for (unsigned j = 0; j < n; j++) {
            uint64_t covered;
            uint64_t busy = fake_busy_ns(index, pids[j], from, now, &covered);
            found[count++] = (nvmlProcessUtilizationSample_t){
                .pid = (unsigned)pids[j],
                .timeStamp = wall / 1000ull,
                .smUtil = percent(busy, now > covered ? now - covered : 1),
            };
        }
    }
    nvmlReturn_t r = 0;
    if (!count)
        r = 6; /* NVML_ERROR_NOT_FOUND: no sample since then */
    else if (!utilization || *processSamplesCount < count)
        r = 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
    else
        for (unsigned j = 0; j < count; j++) utilization[j] = found[j];
    *processSamplesCount = count;
    free(found);
    free(pids);
    return r;
}

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(struct device *device, unsigned int *infoCount,
                                                         nvmlProcessInfo_v1_t *infos) {
    if (!g_initialized) return 1;
    if (!device || !infoCount) return 2;
    if (fake_env("NVML_NO_PROCESSES", 0)) return 13; /* NVML_ERROR_FUNCTION_NOT_FOUND */
    int64_t pids[FAKE_PROCESS_ENTRIES];
    uint64_t bytes[FAKE_PROCESS_ENTRIES];
    unsigned total = 0;
    unsigned n = fake_process_memory((int)device->index, pids, bytes, FAKE_PROCESS_ENTRIES, &total);
    if (!infos || *infoCount < n) {
        *infoCount = n;
        return n ? 7 : 0; /* NVML_ERROR_INSUFFICIENT_SIZE; none running is success */
    }
    for (unsigned i = 0; i < n; i++) infos[i] = (nvmlProcessInfo_v1_t){(unsigned)pids[i], bytes[i]};
    *infoCount = n;
    return 0;
}
