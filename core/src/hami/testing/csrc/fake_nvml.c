/*
 * fake_nvml.c: the minimal fake NVML-compatible management library a CUDA-compatible vendor's isolation tests
 * need (NVML's names: libnvidia-ml.so.1, or a compatible library such as an ixML): device count, handles, indices
 * and the memory query, over the same fake hardware as fake_cuda.c (fake_device.c with the FAKE_CUDA_ variables:
 * FAKE_CUDA_DEVICES, FAKE_CUDA_MEMORY, and what is used from FAKE_CUDA_STATE). Not a discovery fake: this one only
 * answers memory questions and per-process utilization.
 *
 * nvmlDeviceGetProcessUtilization, as NVML documents it: one sample per process that used the device since
 * lastSeenTimeStamp (a CPU timestamp in microseconds, CLOCK_REALTIME; 0: as far back as the records go), with
 * smUtil the percent of that span the device spent on the process's work (rounded), computed from the stretches
 * of the timeline the fake device ran for each process id (fake_busy_ns), and timeStamp now. A NULL buffer (or
 * one too small: NVML_ERROR_INSUFFICIENT_SIZE) asks how many samples there are; none is NVML_ERROR_NOT_FOUND.
 * memUtil, encUtil and decUtil are 0.
 */
#define _GNU_SOURCE
#include "fake_device.h"

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

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(struct device *device, nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp) {
    if (!g_initialized) return 1;
    if (!device || !processSamplesCount) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    int index = (int)device->index;
    uint64_t wall = realtime_ns(), now = fake_now_ns();
    uint64_t seen = (uint64_t)lastSeenTimeStamp * 1000ull; /* as CLOCK_MONOTONIC: */
    uint64_t from = seen >= wall ? now : now - (wall - seen < now ? wall - seen : now);
    /* the processes whose work the device ran since then, each once */
    int64_t pids[FAKE_RUNS];
    unsigned count = 0;
    const struct fake_runs *runs = &fake_state->runs[index];
    for (unsigned i = 0; i < FAKE_RUNS; i++) {
        const struct fake_run_record *r = &runs->records[i];
        if (!atomic_load(&r->seq) || atomic_load(&r->end_ns) <= from || atomic_load(&r->start_ns) >= now) continue;
        int64_t pid = atomic_load(&r->pid);
        unsigned j = 0;
        while (j < count && pids[j] != pid) j++;
        if (j == count) pids[count++] = pid;
    }
    if (!count) {
        *processSamplesCount = 0;
        return 6; /* NVML_ERROR_NOT_FOUND: no sample since then */
    }
    if (!utilization || *processSamplesCount < count) {
        *processSamplesCount = count;
        return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
    }
    for (unsigned j = 0; j < count; j++) {
        uint64_t covered;
        uint64_t busy = fake_busy_ns(index, pids[j], from, now, &covered);
        uint64_t span = now > covered ? now - covered : 1;
        utilization[j] = (nvmlProcessUtilizationSample_t){
            .pid = (unsigned)pids[j],
            .timeStamp = wall / 1000ull,
            .smUtil = (unsigned)((busy * 100u + span / 2) / span),
        };
    }
    *processSamplesCount = count;
    return 0;
}
