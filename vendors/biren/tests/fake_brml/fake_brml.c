/* A fake BRML (libbiren-ml.so) for the Biren tests, written from Biren's brml.h: the calls the plugin's binding makes
 * (brmlInit, brmlShutdown, brmlErrorString, brmlDeviceGetCount, brmlDeviceGetHandleByIndex, brmlDeviceGetUUID,
 * brmlDeviceGetGpuInfo, brmlDeviceGetMemoryInfo, brmlDeviceGetNodeId), with brml.h's structs and return codes.
 *
 * The machine is read at brmlInit from the file named by FAKE_BRML_CONFIG, one card per line:
 *   <uuid> <product name> <memory MiB> <node id>
 * A uuid of "-" makes brmlDeviceGetUUID fail for that card (BRML_ERROR_UNKNOWN). Without the variable, brmlInit
 * answers BRML_ERROR_DRIVER_NOT_LOADED.
 *
 * The readings (brmlDeviceGetMemoryInfo's used, bytes; brmlDeviceGetUtilizationRates' gpu, percent;
 * brmlDeviceGetPowerUsage, milliwatts; brmlDeviceGetTemperature of BRML_TEMPERATURE_GPU and _MEMORY, degrees) answer
 * from the file FAKE_BRML_READINGS names, re-read at every call (core's fake_readings.h, the device index being the
 * card's line; "-": BRML_ERROR_NOT_SUPPORTED, or nothing in use).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_readings.h"

#define DECLDIR __attribute__((visibility("default")))
#define MAX_CARDS 16

typedef enum {
    BRML_SUCCESS = 0,
    BRML_ERROR_UNINITIALIZED = 1,
    BRML_ERROR_INVALID_ARGUMENT = 2,
    BRML_ERROR_NOT_SUPPORTED = 3,
    BRML_ERROR_INSUFFICIENT_SIZE = 6,
    BRML_ERROR_DRIVER_NOT_LOADED = 7,
    BRML_ERROR_UNKNOWN = 0xFF
} brmlReturn_t;

typedef struct brmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} brmlMemory_t;

typedef struct brmlGPUInfo_st {
    char name[96];
    char id[96];
    char serial[96];
    char board_id[96];
} brmlGPUInfo_t;

struct brmlDevice_st {
    char uuid[80];
    char name[96];
    unsigned long long memory_mib;
    unsigned int node_id;
};
typedef struct brmlDevice_st *brmlDevice_t;

static struct brmlDevice_st cards[MAX_CARDS];
static unsigned int count;
static int ready;

DECLDIR brmlReturn_t brmlInit(void) {
    const char *path = getenv("FAKE_BRML_CONFIG");
    FILE *f = path == NULL ? NULL : fopen(path, "r");
    if (f == NULL) return BRML_ERROR_DRIVER_NOT_LOADED;
    char line[512];
    count = 0;
    while (count < MAX_CARDS && fgets(line, sizeof line, f) != NULL) {
        struct brmlDevice_st *c = &cards[count];
        if (sscanf(line, "%79s %95s %llu %u", c->uuid, c->name, &c->memory_mib, &c->node_id) == 4) count++;
    }
    fclose(f);
    ready = 1;
    return BRML_SUCCESS;
}

DECLDIR brmlReturn_t brmlShutdown(void) {
    ready = 0;
    return BRML_SUCCESS;
}

DECLDIR const char *brmlErrorString(brmlReturn_t result) {
    switch (result) {
    case BRML_SUCCESS: return "Success";
    case BRML_ERROR_UNINITIALIZED: return "Uninitialized";
    case BRML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case BRML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

DECLDIR brmlReturn_t brmlDeviceGetCount(unsigned int *deviceCount) {
    if (!ready) return BRML_ERROR_UNINITIALIZED;
    if (deviceCount == NULL) return BRML_ERROR_INVALID_ARGUMENT;
    *deviceCount = count;
    return BRML_SUCCESS;
}

DECLDIR brmlReturn_t brmlDeviceGetHandleByIndex(unsigned int index, brmlDevice_t *device) {
    if (!ready) return BRML_ERROR_UNINITIALIZED;
    if (index >= count || device == NULL) return BRML_ERROR_INVALID_ARGUMENT;
    *device = &cards[index];
    return BRML_SUCCESS;
}

static brmlReturn_t check(brmlDevice_t device, const void *out) {
    if (!ready) return BRML_ERROR_UNINITIALIZED;
    if (device == NULL || out == NULL || device < cards || device >= cards + count) return BRML_ERROR_INVALID_ARGUMENT;
    return BRML_SUCCESS;
}

DECLDIR brmlReturn_t brmlDeviceGetUUID(brmlDevice_t device, char *uuid, unsigned int length) {
    brmlReturn_t r = check(device, uuid);
    if (r != BRML_SUCCESS) return r;
    if (strcmp(device->uuid, "-") == 0) return BRML_ERROR_UNKNOWN;
    if (strlen(device->uuid) + 1 > length) return BRML_ERROR_INSUFFICIENT_SIZE;
    strcpy(uuid, device->uuid);
    return BRML_SUCCESS;
}

DECLDIR brmlReturn_t brmlDeviceGetGpuInfo(brmlDevice_t device, brmlGPUInfo_t *info) {
    brmlReturn_t r = check(device, info);
    if (r != BRML_SUCCESS) return r;
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", device->name);
    snprintf(info->id, sizeof info->id, "%u", device->node_id);
    return BRML_SUCCESS;
}

DECLDIR brmlReturn_t brmlDeviceGetMemoryInfo(brmlDevice_t device, brmlMemory_t *memory) {
    brmlReturn_t r = check(device, memory);
    if (r != BRML_SUCCESS) return r;
    struct fake_reading f;
    if (fake_reading("FAKE_BRML_READINGS", (int)(device - cards), &f) < 0) return BRML_ERROR_UNKNOWN;
    memory->total = device->memory_mib * 1024ULL * 1024ULL;
    memory->used = f.memory_used == FAKE_UNSUPPORTED ? 0 : (unsigned long long)f.memory_used;
    memory->free = memory->used > memory->total ? 0 : memory->total - memory->used;
    return BRML_SUCCESS;
}

typedef struct brmlUtilization_st {
    unsigned int gpu, memory;
} brmlUtilization_t;
typedef enum { BRML_TEMPERATURE_GPU = 0, BRML_TEMPERATURE_MEMORY = 1 } brmlTemperatureSensors_t;

/* Figure `which` (0 busy, 1 power, 2 temperature) of `device`, BRML_ERROR_NOT_SUPPORTED where "-". */
static brmlReturn_t figure(brmlDevice_t device, const void *out, int which, unsigned *value) {
    brmlReturn_t r = check(device, out);
    struct fake_reading f;
    if (r != BRML_SUCCESS) return r;
    if (fake_reading("FAKE_BRML_READINGS", (int)(device - cards), &f) < 0) return BRML_ERROR_UNKNOWN;
    long long v = which == 0 ? f.busy : which == 1 ? f.power_mw : f.celsius;
    if (v == FAKE_UNSUPPORTED) return BRML_ERROR_NOT_SUPPORTED;
    *value = (unsigned)v;
    return BRML_SUCCESS;
}

DECLDIR brmlReturn_t brmlDeviceGetUtilizationRates(brmlDevice_t device, brmlUtilization_t *utilization) {
    unsigned busy = 0;
    brmlReturn_t r = figure(device, utilization, 0, &busy);
    if (r == BRML_SUCCESS) {
        utilization->gpu = busy;
        utilization->memory = 0;
    }
    return r;
}

DECLDIR brmlReturn_t brmlDeviceGetPowerUsage(brmlDevice_t device, unsigned int *power) {
    return figure(device, power, 1, power);
}

DECLDIR brmlReturn_t brmlDeviceGetTemperature(brmlDevice_t device, brmlTemperatureSensors_t sensorType,
                                              unsigned int *temp) {
    if (sensorType != BRML_TEMPERATURE_GPU && sensorType != BRML_TEMPERATURE_MEMORY) return BRML_ERROR_NOT_SUPPORTED;
    return figure(device, temp, 2, temp);
}

DECLDIR brmlReturn_t brmlDeviceGetNodeId(brmlDevice_t device, unsigned int *nodeId) {
    brmlReturn_t r = check(device, nodeId);
    if (r == BRML_SUCCESS) *nodeId = device->node_id;
    return r;
}
