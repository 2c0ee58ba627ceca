/*
 * fake_nvml.c: the minimal fake NVML the isolation tests need (libnvidia-ml.so.1): device count, handles,
 * indices and the memory query, with the same devices as fake_cuda.c (FAKE_CUDA_DEVICES, FAKE_CUDA_MEMORY)
 * and what is used read from the same shared state (FAKE_CUDA_STATE). Not the discovery fake of
 * tests/fake_nvml/: this one only answers memory questions.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_state.h"

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
static unsigned g_count = 1;
static unsigned long long g_memory = 16ull << 30;
static struct fake_state *S;
static int g_initialized;

static unsigned long long env_size(const char *name, unsigned long long fallback) {
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end == 'k' || *end == 'K') x <<= 10;
    if (*end == 'm' || *end == 'M') x <<= 20;
    if (*end == 'g' || *end == 'G') x <<= 30;
    return x;
}

__attribute__((constructor)) static void load(void) {
    g_count = (unsigned)env_size("FAKE_CUDA_DEVICES", 1);
    if (g_count > FAKE_MAX_DEVICES) g_count = FAKE_MAX_DEVICES;
    g_memory = env_size("FAKE_CUDA_MEMORY", 16ull << 30);
    for (unsigned i = 0; i < FAKE_MAX_DEVICES; i++) g_devices[i].index = i;
    const char *path = getenv("FAKE_CUDA_STATE");
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
    *count = g_count;
    return 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, struct device **device) {
    if (!g_initialized) return 1;
    if (!device || index >= g_count) return 2;
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
    unsigned long long allocated = atomic_load(&S->devices[device->index].allocated);
    *total = g_memory;
    *used = allocated;
    *free = allocated > g_memory ? 0 : g_memory - allocated;
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
