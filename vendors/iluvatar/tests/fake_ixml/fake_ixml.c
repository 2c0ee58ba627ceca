/*
 * fake_ixml.c: a fake ixML (Iluvatar CoreX's libixml.so), written from its documented NVML-compatible API
 * (NVML's function names, nvmlReturn_t codes, nvmlMemory_t and nvmlPciInfo_t v3 layouts), for the discovery tests.
 *
 * The machine is read at nvmlInit_v2 from the file FAKE_IXML_CONFIG (else fake_ixml.machine beside the library),
 * one GPU per line:
 *     <uuid> <minor> <memory MiB> <bus id> <board> <health> <name...>
 * e.g. "GPU-4a1f0c2e-0000-0000-0000-000000000001 0 32768 00000000:8A:00.0 0 ok Iluvatar BI-V150S" (chips with the
 * same board number are on one board: nvmlDeviceOnSameBoard, a BI-V150 has two). A GPU whose
 * health is not "ok" answers nvmlDeviceGetMemoryInfo with NVML_ERROR_GPU_IS_LOST; a uuid of "-" makes
 * nvmlDeviceGetUUID fail (a GPU that cannot be named). FAKE_IXML_FAIL_INIT=1 makes nvmlInit_v2 fail
 * (NVML_ERROR_DRIVER_NOT_LOADED). nvmlDeviceGetComputeRunningProcesses answers from the process table
 * FAKE_IXML_PROCESSES names (fake_processes.h; the device index is the GPU's line), and the readings
 * (nvmlDeviceGetMemoryInfo's used, nvmlDeviceGetUtilizationRates, nvmlDeviceGetPowerUsage in milliwatts,
 * nvmlDeviceGetTemperature) from the file FAKE_IXML_READINGS names (fake_readings.h; "-": NVML_ERROR_NOT_SUPPORTED). Built with -DFAKE_NOT_IXML it is instead another project's libixml.so: an XML
 * parser with none of these functions.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_processes.h"
#include "fake_readings.h"

#define EXPORT __attribute__((visibility("default")))

#ifdef FAKE_NOT_IXML
EXPORT void *ixmlParseBuffer(const char *buffer) { return (void *)buffer; }
#else

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { /* nvmlProcessInfo_v1_t, what the unversioned call fills */
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_t;

#define MAX_GPUS 16
struct gpu {
    char uuid[96], name[96], bus[32];
    unsigned minor, board;
    unsigned long long memory_mib;
    int healthy;
};
typedef struct gpu *nvmlDevice_t;

static struct gpu g_gpus[MAX_GPUS];
static unsigned g_count;
static int g_initialized;

static int read_machine(void) {
    const char *path = getenv("FAKE_IXML_CONFIG");
    char beside[4096];
    Dl_info self;
    g_count = 0;
    if (!path && dladdr((void *)&read_machine, &self) && self.dli_fname) {
        snprintf(beside, sizeof beside, "%s", self.dli_fname);
        char *slash = strrchr(beside, '/');
        if (slash) snprintf(slash + 1, sizeof beside - (size_t)(slash + 1 - beside), "fake_ixml.machine");
        path = beside;
    }
    if (!path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    while (g_count < MAX_GPUS && fgets(line, sizeof line, f)) {
        struct gpu *g = &g_gpus[g_count];
        char health[16];
        int used = 0;
        if (sscanf(line, "%95s %u %llu %31s %u %15s %n", g->uuid, &g->minor, &g->memory_mib, g->bus, &g->board, health,
                   &used) < 6)
            continue;
        snprintf(g->name, sizeof g->name, "%s", line + used);
        g->name[strcspn(g->name, "\r\n")] = 0;
        g->healthy = !strcmp(health, "ok");
        g_count++;
    }
    fclose(f);
    return 0;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) {
    const char *fail = getenv("FAKE_IXML_FAIL_INIT");
    if (fail && !strcmp(fail, "1")) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (read_machine() != 0) return NVML_ERROR_UNKNOWN;
    g_initialized = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    g_initialized = 0;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned length) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (!version || length < 6) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(version, length, "4.1.0");
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = g_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *device) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= g_count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_gpus[index];
    return NVML_SUCCESS;
}

static nvmlReturn_t copy(const char *text, char *out, unsigned length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned length) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    if (!strcmp(device->uuid, "-")) return NVML_ERROR_UNKNOWN;
    return copy(device->uuid, uuid, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned length) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    return device ? copy(device->name, name, length) : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned *minor) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *minor = device->minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned *index) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || !index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)(device - g_gpus);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || !pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", device->bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", device->bus + (strlen(device->bus) > 12 ? 4 : 0));
    unsigned domain = 0, bus = 0, dev = 0;
    if (sscanf(device->bus, "%x:%x:%x", &domain, &bus, &dev) == 3) {
        pci->domain = domain;
        pci->bus = bus;
        pci->device = dev;
    }
    pci->pciDeviceId = 0x00021e3e; /* vendor 0x1e3e (Iluvatar) in the low 16 bits, as NVML packs it */
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceOnSameBoard(nvmlDevice_t a, nvmlDevice_t b, int *same) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (!a || !b || !same) return NVML_ERROR_INVALID_ARGUMENT;
    *same = a->board == b->board;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->healthy) return NVML_ERROR_GPU_IS_LOST;
    struct fake_reading r;
    if (fake_reading("FAKE_IXML_READINGS", (int)(device - g_gpus), &r) < 0) return NVML_ERROR_UNKNOWN;
    memory->total = device->memory_mib << 20;
    memory->used = r.memory_used == FAKE_UNSUPPORTED ? 0 : (unsigned long long)r.memory_used;
    memory->free = memory->used > memory->total ? 0 : memory->total - memory->used;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

/* One figure of the readings file for `device`, or NVML_ERROR_NOT_SUPPORTED where it is "-". */
static nvmlReturn_t reading(nvmlDevice_t device, int which, unsigned *out) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || !out) return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->healthy) return NVML_ERROR_GPU_IS_LOST;
    struct fake_reading r;
    if (fake_reading("FAKE_IXML_READINGS", (int)(device - g_gpus), &r) < 0) return NVML_ERROR_UNKNOWN;
    long long value = which == 0 ? r.busy : which == 1 ? r.power_mw : r.celsius;
    if (value == FAKE_UNSUPPORTED) return NVML_ERROR_NOT_SUPPORTED;
    *out = (unsigned)value;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *rates) {
    if (!rates) return NVML_ERROR_INVALID_ARGUMENT;
    rates->memory = 0;
    return reading(device, 0, &rates->gpu);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned *milliwatts) {
    return reading(device, 1, milliwatts);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned *celsius) {
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT; /* NVML_TEMPERATURE_GPU */
    return reading(device, 2, celsius);
}

/* As NVML documents: *count is the room in `infos` on the way in and the number of processes on the way out; too
 * little room (a NULL buffer with 0 is how callers ask) gives NVML_ERROR_INSUFFICIENT_SIZE with the number needed. */
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned *count, nvmlProcessInfo_t *infos) {
    if (!g_initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || !count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->healthy) return NVML_ERROR_GPU_IS_LOST;
    struct fake_process found[256];
    int n = fake_processes("FAKE_IXML_PROCESSES", (int)(device - g_gpus), found, 256);
    if (n < 0 || n > 256) return NVML_ERROR_UNKNOWN;
    unsigned room = infos ? *count : 0;
    *count = (unsigned)n;
    if ((unsigned)n > room) return NVML_ERROR_INSUFFICIENT_SIZE;
    for (int i = 0; i < n; i++) {
        infos[i].pid = found[i].pid;
        infos[i].usedGpuMemory = found[i].bytes;
    }
    return NVML_SUCCESS;
}
#endif
