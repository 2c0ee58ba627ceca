/*
 * fake_mtml.c: a fake libmtml.so for the Moore Threads tests, written from MTML's documented API (mtml.h, MTML 2.2:
 * the opaque MtmlLibrary / MtmlDevice / MtmlMemory objects, MtmlReturn codes, MtmlPciInfo, MtmlDeviceProperty and
 * MtmlDeviceTopologyLevel as the header defines them).
 *
 * The machine is read from $FAKE_MTML_CONFIG at mtmlLibraryInit, one device per line:
 *   <uuid> <name, '_' for spaces> <pci sbdf> <memory total bytes> <memory used bytes> <gpu cores> <numa>
 *   <mpc type 0|1|2> <switch>
 * Devices are numbered in file order; /dev/mtgpu.<i>, /dev/dri/card<i+1> and /dev/dri/renderD<128+i> are their
 * paths. Two devices on the same <switch> are MTML_TOPOLOGY_SINGLE apart, on the same NUMA node
 * MTML_TOPOLOGY_NODE, else MTML_TOPOLOGY_SYSTEM. FAKE_MTML_FAIL=<function>[:<device index>] makes that function
 * fail with MTML_ERROR_DRIVER_FAILURE (for every device, or that one). fake_mtml_live_objects() (not MTML) counts
 * the objects handed out and not yet freed.
 *
 * The readings (mtmlMemoryGetUsed, bytes; the GPU object's mtmlGpuGetUtilization, percent, and
 * mtmlGpuGetTemperature, degrees; mtmlDeviceGetPowerUsage, milliwatts) answer from the file $FAKE_MTML_READINGS
 * names, re-read at every call (core's fake_readings.h, the device index being the line; "-":
 * MTML_ERROR_NOT_SUPPORTED, or the machine's memory in use).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_readings.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEV 16

typedef enum {
    MTML_SUCCESS = 0,
    MTML_ERROR_DRIVER_NOT_LOADED,
    MTML_ERROR_DRIVER_FAILURE,
    MTML_ERROR_INVALID_ARGUMENT,
    MTML_ERROR_NOT_SUPPORTED,
    MTML_ERROR_NO_PERMISSION,
    MTML_ERROR_INSUFFICIENT_SIZE,
    MTML_ERROR_NOT_FOUND,
    MTML_ERROR_INSUFFICIENT_MEMORY,
    MTML_ERROR_UNKNOWN = 999
} MtmlReturn;

typedef enum {
    MTML_TOPOLOGY_INTERNAL = 0,
    MTML_TOPOLOGY_SINGLE = 1,
    MTML_TOPOLOGY_MULTIPLE = 2,
    MTML_TOPOLOGY_HOSTBRIDGE = 3,
    MTML_TOPOLOGY_NODE = 4,
    MTML_TOPOLOGY_SYSTEM = 5,
} MtmlDeviceTopologyLevel;

typedef struct {
    char sbdf[32];
    unsigned int segment, bus, device, pciDeviceId, pciSubsystemId, busWidth;
    float pciMaxSpeed, pciCurSpeed;
    unsigned int pciMaxWidth, pciCurWidth, pciMaxGen, pciCurGen;
    int rsvd[6];
} MtmlPciInfo;

typedef struct {
    unsigned int virtCap : 1;
    unsigned int virtRole : 3;
    unsigned int mpcCap : 1;
    unsigned int mpcType : 3;
    unsigned int mtLinkCap : 1;
    unsigned int rsvd : 23;
    unsigned int rsvd2 : 32;
} MtmlDeviceProperty;

struct fake_dev {
    char uuid[64], name[64], sbdf[32];
    unsigned long long total, used;
    unsigned cores;
    int numa, mpc, sw;
};

typedef struct MtmlLibrary {
    int n;
    struct fake_dev devs[MAX_DEV];
} MtmlLibrary;

typedef struct MtmlDevice {
    const MtmlLibrary *lib;
    unsigned index;
} MtmlDevice;

typedef struct MtmlMemory {
    const MtmlDevice *dev;
} MtmlMemory;

static MtmlLibrary g_lib;
static int g_live;

EXPORT int fake_mtml_live_objects(void) { return g_live; }

static int failing(const char *name, int index) {
    const char *fail = getenv("FAKE_MTML_FAIL");
    if (!fail) return 0;
    size_t len = strlen(name);
    if (strncmp(fail, name, len) != 0) return 0;
    if (fail[len] == '\0') return 1;
    return fail[len] == ':' && index >= 0 && atoi(fail + len + 1) == index;
}

static MtmlReturn copy_text(const char *text, char *out, unsigned length) {
    if (!out) return MTML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return MTML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return MTML_SUCCESS;
}

#define DEV_OR_FAIL(name)                                                                                  \
    if (!dev || !dev->lib || dev->index >= (unsigned)dev->lib->n) return MTML_ERROR_INVALID_ARGUMENT;     \
    if (failing(name, (int)dev->index)) return MTML_ERROR_DRIVER_FAILURE;                                  \
    const struct fake_dev *d = &dev->lib->devs[dev->index];                                                \
    (void)d;

EXPORT MtmlReturn mtmlLibraryInit(MtmlLibrary **lib) {
    if (!lib) return MTML_ERROR_INVALID_ARGUMENT;
    const char *path = getenv("FAKE_MTML_CONFIG");
    if (failing("mtmlLibraryInit", -1) || !path) return MTML_ERROR_DRIVER_NOT_LOADED;
    FILE *f = fopen(path, "r");
    if (!f) return MTML_ERROR_DRIVER_NOT_LOADED;
    memset(&g_lib, 0, sizeof g_lib);
    while (g_lib.n < MAX_DEV) {
        struct fake_dev *d = &g_lib.devs[g_lib.n];
        int got = fscanf(f, "%63s %63s %31s %llu %llu %u %d %d %d", d->uuid, d->name, d->sbdf, &d->total, &d->used,
                         &d->cores, &d->numa, &d->mpc, &d->sw);
        if (got != 9) break;
        for (char *c = d->name; *c; c++)
            if (*c == '_') *c = ' ';
        if (strcmp(d->uuid, "-") == 0) d->uuid[0] = '\0';
        g_lib.n++;
    }
    fclose(f);
    *lib = &g_lib;
    g_live++;
    return MTML_SUCCESS;
}

EXPORT MtmlReturn mtmlLibraryShutDown(MtmlLibrary *lib) {
    if (lib != &g_lib) return MTML_ERROR_INVALID_ARGUMENT;
    g_live--;
    return MTML_SUCCESS;
}

EXPORT MtmlReturn mtmlLibraryCountDevice(const MtmlLibrary *lib, unsigned int *count) {
    if (!lib || !count) return MTML_ERROR_INVALID_ARGUMENT;
    if (failing("mtmlLibraryCountDevice", -1)) return MTML_ERROR_DRIVER_FAILURE;
    *count = (unsigned)lib->n;
    return MTML_SUCCESS;
}

EXPORT MtmlReturn mtmlLibraryInitDeviceByIndex(const MtmlLibrary *lib, unsigned int index, MtmlDevice **dev) {
    if (!lib || !dev) return MTML_ERROR_INVALID_ARGUMENT;
    if (index >= (unsigned)lib->n) return MTML_ERROR_NOT_FOUND;
    if (failing("mtmlLibraryInitDeviceByIndex", (int)index)) return MTML_ERROR_DRIVER_FAILURE;
    MtmlDevice *out = malloc(sizeof *out);
    if (!out) return MTML_ERROR_INSUFFICIENT_MEMORY;
    out->lib = lib;
    out->index = index;
    *dev = out;
    g_live++;
    return MTML_SUCCESS;
}

EXPORT MtmlReturn mtmlLibraryFreeDevice(MtmlDevice *dev) {
    if (!dev) return MTML_ERROR_INVALID_ARGUMENT;
    free(dev);
    g_live--;
    return MTML_SUCCESS;
}

EXPORT MtmlReturn mtmlDeviceGetIndex(const MtmlDevice *dev, unsigned int *index) {
    DEV_OR_FAIL("mtmlDeviceGetIndex");
    if (!index) return MTML_ERROR_INVALID_ARGUMENT;
    *index = dev->index;
    return MTML_SUCCESS;
}

EXPORT MtmlReturn mtmlDeviceGetUUID(const MtmlDevice *dev, char *uuid, unsigned int length) {
    DEV_OR_FAIL("mtmlDeviceGetUUID");
    return copy_text(d->uuid, uuid, length);
}

EXPORT MtmlReturn mtmlDeviceGetName(const MtmlDevice *dev, char *name, unsigned int length) {
    DEV_OR_FAIL("mtmlDeviceGetName");
    return copy_text(d->name, name, length);
}

EXPORT MtmlReturn mtmlDeviceGetPciInfo(const MtmlDevice *dev, MtmlPciInfo *pci) {
    DEV_OR_FAIL("mtmlDeviceGetPciInfo");
    if (!pci) return MTML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    strncpy(pci->sbdf, d->sbdf, sizeof pci->sbdf - 1);
    unsigned seg = 0, bus = 0, device = 0;
    if (sscanf(d->sbdf, "%x:%x:%x", &seg, &bus, &device) == 3) {
        pci->segment = seg;
        pci->bus = bus;
        pci->device = device;
    }
    pci->pciDeviceId = 0x03001ed5u; /* device id << 16 | Moore Threads' vendor id */
    return MTML_SUCCESS;
}

EXPORT MtmlReturn mtmlDeviceGetProperty(const MtmlDevice *dev, MtmlDeviceProperty *prop) {
    DEV_OR_FAIL("mtmlDeviceGetProperty");
    if (!prop) return MTML_ERROR_INVALID_ARGUMENT;
    memset(prop, 0, sizeof *prop);
    prop->mpcCap = d->mpc != 0;
    prop->mpcType = (unsigned)d->mpc;
    return MTML_SUCCESS;
}

EXPORT MtmlReturn mtmlDeviceCountGpuCores(const MtmlDevice *dev, unsigned int *numCores) {
    DEV_OR_FAIL("mtmlDeviceCountGpuCores");
    if (!numCores) return MTML_ERROR_INVALID_ARGUMENT;
    *numCores = d->cores;
    return MTML_SUCCESS;
}

static MtmlReturn path_of(const MtmlDevice *dev, const char *name, const char *fmt, unsigned base, char *path,
                          unsigned length) {
    DEV_OR_FAIL(name);
    char text[64];
    snprintf(text, sizeof text, fmt, base + dev->index);
    return copy_text(text, path, length);
}

EXPORT MtmlReturn mtmlDeviceGetGpuPath(const MtmlDevice *dev, char *path, unsigned int length) {
    return path_of(dev, "mtmlDeviceGetGpuPath", "/dev/mtgpu.%u", 0, path, length);
}

EXPORT MtmlReturn mtmlDeviceGetPrimaryPath(const MtmlDevice *dev, char *path, unsigned int length) {
    return path_of(dev, "mtmlDeviceGetPrimaryPath", "/dev/dri/card%u", 1, path, length);
}

EXPORT MtmlReturn mtmlDeviceGetRenderPath(const MtmlDevice *dev, char *path, unsigned int length) {
    return path_of(dev, "mtmlDeviceGetRenderPath", "/dev/dri/renderD%u", 128, path, length);
}

EXPORT MtmlReturn mtmlDeviceGetMemoryAffinityWithinNode(const MtmlDevice *dev, unsigned int nodeSetSize,
                                                         unsigned long *nodeSet) {
    DEV_OR_FAIL("mtmlDeviceGetMemoryAffinityWithinNode");
    if (!nodeSet || nodeSetSize == 0) return MTML_ERROR_INVALID_ARGUMENT;
    memset(nodeSet, 0, nodeSetSize * sizeof *nodeSet);
    nodeSet[0] = 1ul << d->numa;
    return MTML_SUCCESS;
}

EXPORT MtmlReturn mtmlDeviceInitMemory(const MtmlDevice *dev, MtmlMemory **mem) {
    DEV_OR_FAIL("mtmlDeviceInitMemory");
    if (!mem) return MTML_ERROR_INVALID_ARGUMENT;
    MtmlMemory *out = malloc(sizeof *out);
    if (!out) return MTML_ERROR_INSUFFICIENT_MEMORY;
    out->dev = dev;
    *mem = out;
    g_live++;
    return MTML_SUCCESS;
}

EXPORT MtmlReturn mtmlDeviceFreeMemory(MtmlMemory *mem) {
    if (!mem) return MTML_ERROR_INVALID_ARGUMENT;
    free(mem);
    g_live--;
    return MTML_SUCCESS;
}

EXPORT MtmlReturn mtmlMemoryGetTotal(const MtmlMemory *mem, unsigned long long *total) {
    if (!mem || !total) return MTML_ERROR_INVALID_ARGUMENT;
    const MtmlDevice *dev = mem->dev;
    DEV_OR_FAIL("mtmlMemoryGetTotal");
    *total = d->total;
    return MTML_SUCCESS;
}

EXPORT MtmlReturn mtmlMemoryGetUsed(const MtmlMemory *mem, unsigned long long *used) {
    if (!mem || !used) return MTML_ERROR_INVALID_ARGUMENT;
    const MtmlDevice *dev = mem->dev;
    DEV_OR_FAIL("mtmlMemoryGetUsed");
    struct fake_reading r;
    if (fake_reading("FAKE_MTML_READINGS", (int)dev->index, &r) < 0) return MTML_ERROR_UNKNOWN;
    *used = r.memory_used == FAKE_UNSUPPORTED ? d->used : (unsigned long long)r.memory_used;
    return MTML_SUCCESS;
}

typedef struct MtmlGpu {
    const MtmlDevice *dev;
} MtmlGpu;

EXPORT MtmlReturn mtmlDeviceInitGpu(const MtmlDevice *dev, MtmlGpu **gpu) {
    DEV_OR_FAIL("mtmlDeviceInitGpu");
    (void)d;
    if (!gpu) return MTML_ERROR_INVALID_ARGUMENT;
    MtmlGpu *out = malloc(sizeof *out);
    if (!out) return MTML_ERROR_INSUFFICIENT_MEMORY;
    out->dev = dev;
    *gpu = out;
    g_live++;
    return MTML_SUCCESS;
}

EXPORT MtmlReturn mtmlDeviceFreeGpu(MtmlGpu *gpu) {
    if (!gpu) return MTML_ERROR_INVALID_ARGUMENT;
    free(gpu);
    g_live--;
    return MTML_SUCCESS;
}

/* Figure `which` (0 busy, 1 power, 2 temperature) of device `index`, MTML_ERROR_NOT_SUPPORTED where "-". */
static MtmlReturn figure(unsigned index, int which, long long *out) {
    struct fake_reading r;
    if (fake_reading("FAKE_MTML_READINGS", (int)index, &r) < 0) return MTML_ERROR_UNKNOWN;
    *out = which == 0 ? r.busy : which == 1 ? r.power_mw : r.celsius;
    return *out == FAKE_UNSUPPORTED ? MTML_ERROR_NOT_SUPPORTED : MTML_SUCCESS;
}

EXPORT MtmlReturn mtmlGpuGetUtilization(const MtmlGpu *gpu, unsigned int *utilization) {
    if (!gpu || !utilization) return MTML_ERROR_INVALID_ARGUMENT;
    const MtmlDevice *dev = gpu->dev;
    DEV_OR_FAIL("mtmlGpuGetUtilization");
    (void)d;
    long long value;
    MtmlReturn code = figure(dev->index, 0, &value);
    if (code == MTML_SUCCESS) *utilization = (unsigned)value;
    return code;
}

EXPORT MtmlReturn mtmlGpuGetTemperature(const MtmlGpu *gpu, int *temperature) {
    if (!gpu || !temperature) return MTML_ERROR_INVALID_ARGUMENT;
    const MtmlDevice *dev = gpu->dev;
    DEV_OR_FAIL("mtmlGpuGetTemperature");
    (void)d;
    long long value;
    MtmlReturn code = figure(dev->index, 2, &value);
    if (code == MTML_SUCCESS) *temperature = (int)value;
    return code;
}

EXPORT MtmlReturn mtmlDeviceGetPowerUsage(const MtmlDevice *dev, unsigned int *power) {
    DEV_OR_FAIL("mtmlDeviceGetPowerUsage");
    (void)d;
    if (!power) return MTML_ERROR_INVALID_ARGUMENT;
    long long value;
    MtmlReturn code = figure(dev->index, 1, &value);
    if (code == MTML_SUCCESS) *power = (unsigned)value;
    return code;
}

EXPORT MtmlReturn mtmlDeviceGetTopologyLevel(const MtmlDevice *dev1, const MtmlDevice *dev2,
                                             MtmlDeviceTopologyLevel *level) {
    if (!dev1 || !dev2 || !level || dev1->lib != dev2->lib) return MTML_ERROR_INVALID_ARGUMENT;
    const MtmlDevice *dev = dev1;
    DEV_OR_FAIL("mtmlDeviceGetTopologyLevel");
    const struct fake_dev *e = &dev2->lib->devs[dev2->index];
    if (d->sw == e->sw)
        *level = MTML_TOPOLOGY_SINGLE;
    else if (d->numa == e->numa)
        *level = MTML_TOPOLOGY_NODE;
    else
        *level = MTML_TOPOLOGY_SYSTEM;
    return MTML_SUCCESS;
}
