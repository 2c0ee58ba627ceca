/*
 * fake_mxsml.c: a fake of MetaX's management library libmxsml.so for the MetaX tests, written from MXSML's
 * documented API (MxSml.h, MXSML 2.3.1): mxSmlInit, mxSmlGetDeviceCount (returns the count), mxSmlGetDeviceInfo
 * (mxSmlDeviceInfo_t), mxSmlGetMemoryInfo (mxSmlMemoryInfo_t, KB), mxSmlGetDeviceState (1 available, 0 not),
 * mxSmlGetDeviceTopology (mxSmlGpuTopologyLevel_t) and mxSmlGetErrorString.
 *
 * The machine is read from $FAKE_MXSML_CONFIG at every call, one device per line:
 *   <bdf> <uuid> <device name> <vram total KB> <vram used KB> <state> <metalink group>
 * Two devices of the same non-zero MetaLink group are MXSML_TOPOLOGY_METAXLINK to each other; other pairs are
 * MXSML_TOPOLOGY_SYSTEM. FAKE_MXSML_FAIL=<function> makes that function fail with MXSML_Failure (mxSmlInit with
 * MXSML_NoDevice).
 *
 * The readings (mxSmlGetMemoryInfo's VRAM in use, KB; mxSmlGetDeviceIpUsage of MXSML_Usage_Xcore, percent;
 * mxSmlGetBoardPowerInfo, three 12 V ways whose powers in mW add up to the board's; mxSmlGetTemperatureInfo of
 * MXSML_Temperature_Hotspot, degrees x 100) answer from the file $FAKE_MXSML_READINGS names (core's fake_readings.h;
 * "-": MXSML_OperationNotSupport, or the machine's VRAM in use).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_processes.h"
#include "fake_readings.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEV 32

typedef enum {
    MXSML_Success = 0,
    MXSML_Failure = 1,
    MXSML_NoDevice = 2,
    MXSML_OperationNotSupport = 3,
    MXSML_InvalidDeviceId = 6,
    MXSML_InvalidInput = 9,
    MXSML_InsufficientSize = 10,
} mxSmlReturn_t;

typedef enum { MXSML_Device_Unknown = 0 } mxSmlDeviceType_t;
typedef enum { MXSML_Brand_Unknown = 0, MXSML_Brand_N, MXSML_Brand_C, MXSML_Brand_G } mxSmlDeviceBrand_t;
typedef enum { MXSML_Virtualization_Mode_None = 0 } mxSmlDeviceVirtualizationMode_t;
typedef enum {
    MXSML_TOPOLOGY_INTERNAL,
    MXSML_TOPOLOGY_SINGLE,
    MXSML_TOPOLOGY_MULTIPLE,
    MXSML_TOPOLOGY_HOSTBRIDGE,
    MXSML_TOPOLOGY_NODE,
    MXSML_TOPOLOGY_METAXLINK,
    MXSML_TOPOLOGY_SYSTEM,
    MXSML_TOPOLOGY_ETH,
    MXSML_TOPOLOGY_UNDEFINED
} mxSmlGpuTopologyLevel_t;

#define DEVICE_BDF_ID_SIZE 32
#define DEVICE_UUID_SIZE 96
#define DEVICE_NAME_SIZE 32

typedef struct {
    unsigned int deviceId;
    mxSmlDeviceType_t type;
    char bdfId[DEVICE_BDF_ID_SIZE];
    unsigned int gpuId;
    unsigned int nodeId;
    char uuid[DEVICE_UUID_SIZE];
    mxSmlDeviceBrand_t brand;
    mxSmlDeviceVirtualizationMode_t mode;
    char deviceName[DEVICE_NAME_SIZE];
} mxSmlDeviceInfo_t;

typedef struct {
    long visVramTotal;
    long visVramUse;
    long vramTotal;
    long vramUse;
    long xttTotal;
    long xttUse;
} mxSmlMemoryInfo_t;

#define PROCESS_NAME_SIZE 64
#define MAX_GPU_NUM_USED_BY_PROCESS 64
typedef struct {
    char bdfId[DEVICE_BDF_ID_SIZE];
    unsigned int gpuId;
    unsigned long gpuMemoryUsage; /* bytes */
} mxSmlProcessGpuInfo_t;
typedef struct {
    unsigned int processId;
    char processName[PROCESS_NAME_SIZE];
    unsigned int gpuNumber;
    mxSmlProcessGpuInfo_t processGpuInfo[MAX_GPU_NUM_USED_BY_PROCESS];
} mxSmlProcessInfo_t;

struct dev {
    char bdf[DEVICE_BDF_ID_SIZE];
    char uuid[DEVICE_UUID_SIZE];
    char name[DEVICE_NAME_SIZE];
    long total, used;
    int state, link;
};

static int g_init;

static int load(struct dev *out) {
    const char *path = getenv("FAKE_MXSML_CONFIG");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return 0;
    int n = 0;
    while (n < MAX_DEV) {
        struct dev d;
        int got = fscanf(f, "%31s %95s %31s %ld %ld %d %d", d.bdf, d.uuid, d.name, &d.total, &d.used, &d.state, &d.link);
        if (got != 7) break;
        out[n++] = d;
    }
    fclose(f);
    return n;
}

static int failing(const char *name) {
    const char *fail = getenv("FAKE_MXSML_FAIL");
    return fail && strcmp(fail, name) == 0;
}

#define DEVICE_OR_FAIL(name, index)                                                                        \
    struct dev devs[MAX_DEV];                                                                              \
    int n = load(devs);                                                                                    \
    if (!g_init) return MXSML_Failure;                                                                     \
    if (failing(name)) return MXSML_Failure;                                                               \
    if ((int)(index) >= n) return MXSML_InvalidDeviceId;                                                   \
    struct dev *d = &devs[index];

EXPORT mxSmlReturn_t mxSmlInit(void) {
    struct dev devs[MAX_DEV];
    if (failing("mxSmlInit") || load(devs) == 0) return MXSML_NoDevice;
    g_init = 1;
    return MXSML_Success;
}

EXPORT unsigned int mxSmlGetDeviceCount(void) {
    struct dev devs[MAX_DEV];
    if (!g_init) return 0;
    return (unsigned int)load(devs);
}

EXPORT mxSmlReturn_t mxSmlGetDeviceInfo(unsigned int deviceId, mxSmlDeviceInfo_t *info) {
    DEVICE_OR_FAIL("mxSmlGetDeviceInfo", deviceId)
    if (!info) return MXSML_InvalidInput;
    memset(info, 0, sizeof *info);
    info->deviceId = deviceId;
    info->gpuId = deviceId;
    info->nodeId = deviceId + 1;
    info->brand = MXSML_Brand_C;
    info->mode = MXSML_Virtualization_Mode_None;
    snprintf(info->bdfId, sizeof info->bdfId, "%s", d->bdf);
    snprintf(info->uuid, sizeof info->uuid, "%s", d->uuid);
    snprintf(info->deviceName, sizeof info->deviceName, "%s", d->name);
    return MXSML_Success;
}

EXPORT mxSmlReturn_t mxSmlGetMemoryInfo(unsigned int deviceId, mxSmlMemoryInfo_t *memory) {
    DEVICE_OR_FAIL("mxSmlGetMemoryInfo", deviceId)
    if (!memory) return MXSML_InvalidInput;
    struct fake_reading r;
    if (fake_reading("FAKE_MXSML_READINGS", (int)deviceId, &r) < 0) return MXSML_Failure;
    memset(memory, 0, sizeof *memory);
    memory->vramTotal = d->total;
    memory->vramUse = r.memory_used == FAKE_UNSUPPORTED ? d->used : (long)(r.memory_used / 1024);
    memory->visVramTotal = d->total;
    memory->visVramUse = memory->vramUse;
    return MXSML_Success;
}

typedef enum { MXSML_Usage_Dla, MXSML_Usage_Vpue, MXSML_Usage_Vpud, MXSML_Usage_G2d, MXSML_Usage_Xcore } mxSmlUsageIp_t;
typedef enum { MXSML_Temperature_Hotspot = 0 } mxSmlTemperatureSensors_t;
typedef struct {
    unsigned int voltage, current, power; /* mV, mA, mW */
} mxSmlBoardWayElectricInfo_t;

/* Figure `which` (0 busy, 1 power, 2 temperature) of device `id`, MXSML_OperationNotSupport where "-". */
static mxSmlReturn_t figure(unsigned id, int which, long long *out) {
    struct fake_reading r;
    if (fake_reading("FAKE_MXSML_READINGS", (int)id, &r) < 0) return MXSML_Failure;
    *out = which == 0 ? r.busy : which == 1 ? r.power_mw : r.celsius;
    return *out == FAKE_UNSUPPORTED ? MXSML_OperationNotSupport : MXSML_Success;
}

EXPORT mxSmlReturn_t mxSmlGetDeviceIpUsage(unsigned int deviceId, mxSmlUsageIp_t ip, int *usage) {
    DEVICE_OR_FAIL("mxSmlGetDeviceIpUsage", deviceId)
    (void)d;
    long long busy;
    if (!usage || ip != MXSML_Usage_Xcore) return MXSML_InvalidInput; /* a C-class device */
    mxSmlReturn_t code = figure(deviceId, 0, &busy);
    if (code == MXSML_Success) *usage = (int)busy;
    return code;
}

EXPORT mxSmlReturn_t mxSmlGetBoardPowerInfo(unsigned int deviceId, unsigned int *infoSize,
                                            mxSmlBoardWayElectricInfo_t *boardInfo) {
    DEVICE_OR_FAIL("mxSmlGetBoardPowerInfo", deviceId)
    (void)d;
    long long milliwatts;
    if (!infoSize) return MXSML_InvalidInput;
    mxSmlReturn_t code = figure(deviceId, 1, &milliwatts);
    if (code != MXSML_Success) return code;
    if (*infoSize < 3 || !boardInfo) { /* a C-class device supplies 3 ways of 12 V */
        *infoSize = 3;
        return MXSML_InsufficientSize;
    }
    *infoSize = 3;
    for (int way = 0; way < 3; way++) {
        boardInfo[way].voltage = 12000;
        boardInfo[way].power = (unsigned)(milliwatts / 3 + (way == 0 ? milliwatts % 3 : 0));
        boardInfo[way].current = boardInfo[way].power * 1000 / 12000;
    }
    return MXSML_Success;
}

EXPORT mxSmlReturn_t mxSmlGetTemperatureInfo(unsigned int deviceId, mxSmlTemperatureSensors_t sensor, int *temperature) {
    DEVICE_OR_FAIL("mxSmlGetTemperatureInfo", deviceId)
    (void)d;
    long long celsius;
    if (!temperature || sensor != MXSML_Temperature_Hotspot) return MXSML_InvalidInput;
    mxSmlReturn_t code = figure(deviceId, 2, &celsius);
    if (code == MXSML_Success) *temperature = (int)(celsius * 100);
    return code;
}

EXPORT mxSmlReturn_t mxSmlGetDeviceState(unsigned int deviceId, int *state) {
    DEVICE_OR_FAIL("mxSmlGetDeviceState", deviceId)
    if (!state) return MXSML_InvalidInput;
    *state = d->state;
    return MXSML_Success;
}

EXPORT mxSmlReturn_t mxSmlGetDeviceTopology(unsigned int a, unsigned int b, mxSmlGpuTopologyLevel_t *level) {
    struct dev devs[MAX_DEV];
    int n = load(devs);
    if (!g_init || failing("mxSmlGetDeviceTopology")) return MXSML_Failure;
    if ((int)a >= n || (int)b >= n) return MXSML_InvalidDeviceId;
    if (!level) return MXSML_InvalidInput;
    if (a == b)
        *level = MXSML_TOPOLOGY_INTERNAL;
    else if (devs[a].link != 0 && devs[a].link == devs[b].link)
        *level = MXSML_TOPOLOGY_METAXLINK;
    else
        *level = MXSML_TOPOLOGY_SYSTEM;
    return MXSML_Success;
}

EXPORT const char *mxSmlGetErrorString(mxSmlReturn_t result) {
    switch (result) {
    case MXSML_Success: return "Success";
    case MXSML_Failure: return "Failure";
    case MXSML_NoDevice: return "No device";
    case MXSML_InvalidDeviceId: return "Invalid device id";
    case MXSML_InvalidInput: return "Invalid input";
    default: return "Unknown error";
    }
}

EXPORT mxSmlReturn_t mxSmlGetSingleGpuProcess(unsigned int deviceId, unsigned int *processNumber,
                                              mxSmlProcessInfo_t *processInfo) {
    DEVICE_OR_FAIL("mxSmlGetSingleGpuProcess", deviceId)
    if (!processNumber || !processInfo) return MXSML_InvalidInput;
    struct fake_process found[256];
    int count = fake_processes("FAKE_MXSML_PROCESSES", (int)deviceId, found, 256);
    if (count < 0 || count > 256) return MXSML_Failure;
    unsigned room = *processNumber;
    for (int i = 0; i < count && (unsigned)i < room; i++) {
        mxSmlProcessInfo_t *p = &processInfo[i];
        memset(p, 0, sizeof *p);
        p->processId = found[i].pid;
        snprintf(p->processName, sizeof p->processName, "python3");
        p->gpuNumber = 1;
        snprintf(p->processGpuInfo[0].bdfId, sizeof p->processGpuInfo[0].bdfId, "%s", d->bdf);
        p->processGpuInfo[0].gpuId = deviceId;
        p->processGpuInfo[0].gpuMemoryUsage = (unsigned long)found[i].bytes;
    }
    *processNumber = (unsigned)count;
    return MXSML_Success;
}
