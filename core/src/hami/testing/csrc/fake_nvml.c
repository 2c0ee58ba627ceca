/*
 * fake_nvml.c: the minimal fake NVML-compatible management library a CUDA-compatible vendor's isolation tests
 * need (NVML's names: libnvidia-ml.so.1, or a compatible library such as an ixML): device count, handles, indices
 * and the memory query, over the same fake hardware as fake_cuda.c (fake_device.c with the FAKE_CUDA_ variables:
 * FAKE_CUDA_DEVICES, FAKE_CUDA_MEMORY, and what is used from FAKE_CUDA_STATE). Not a discovery fake: this one only
 * answers memory questions.
 */
#define _GNU_SOURCE
#include "fake_device.h"

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
