/* A fake libcndev.so, written from CNDev's documented interface (cndev.h): the calls the Cambricon plugin makes,
 * answering from a machine description in $FAKE_CNDEV_CONFIG, one card a line:
 *     <uuid> <card name> <memory MB> <MLU cores> <health: 1 healthy, 0 in trouble> [<sMLU mode 1/0> [<links> [<NUMA>]]]
 * where <links> is the comma-joined UUIDs (without MLU-) the card's MLU-Link ports reach, a port per entry, "-"
 * for a port that is down (a lone "-": no port at all), and <NUMA> the card's NUMA node (default 0). $FAKE_CNDEV_FAIL names one call that returns CNDEV_ERROR_UNKNOWN (7);
 * $FAKE_CNDEV_NO_INIT makes cndevInit answer CNDEV_ERROR_NO_DRIVER (1). Built with -DOLD_DRIVER it lacks
 * cndevGetMemoryUsageV2 (and the sMLU and MLU-Link calls), as older drivers do.
 *
 * cndevGetProcessInfo answers from the process table $FAKE_CNDEV_PROCESSES names (core's fake_processes.h; the
 * device index is the card's line), the memory in KiB as CNDev reports it. The readings (the memory calls'
 * physicalMemoryUsed, MB; cndevGetDeviceUtilizationInfo's averageCoreUtilization, percent;
 * cndevGetDevicePowerInfo's usage, W; cndevGetTemperatureInfo's board temperature, degrees) answer from the file
 * $FAKE_CNDEV_READINGS names (core's fake_readings.h; "-": CNDEV_ERROR_NOT_SUPPORTED, or nothing in use).
 *
 * sMLU (the driver's slices): profiles (a quota in percent and a memory size in bytes) and instances made from
 * them live in the driver, not in the caller: the fake keeps them in the file $FAKE_CNDEV_STATE (read before and
 * written after every sMLU call; without it, in this process only), so they outlive the process that made them,
 * as a driver's do. A card's instances
 * never exceed 100 % quota nor its memory (CNDEV_ERROR_INSUFFICIENT_SPACE); an instance's handle is
 * (instance id << 8) | card, its device node /dev/cambricon-caps/cap_dev<card>_mi<instance id>. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_processes.h"
#include "fake_readings.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_CARDS 64

typedef enum {
    CNDEV_SUCCESS = 0,
    CNDEV_ERROR_NO_DRIVER = 1,
    CNDEV_ERROR_UNINITIALIZED = 4,
    CNDEV_ERROR_INVALID_ARGUMENT = 5,
    CNDEV_ERROR_INVALID_DEVICE_ID = 6,
    CNDEV_ERROR_UNKNOWN = 7,
    CNDEV_ERROR_INSUFFICIENT_SPACE = 9,
    CNDEV_ERROR_NOT_SUPPORTED = 10,
    CNDEV_ERROR_INVALID_LINK = 11,
    CNDEV_ERROR_NOT_FOUND = 14,
    CNDEV_ERROR_IN_USE = 15,
    CNDEV_ERROR_DUPLICATE = 16,
} cndevRet_t;
typedef int32_t cndevDevice_t;
typedef struct { int32_t version; uint32_t number; } cndevCardInfo_t;
typedef struct { int32_t version; uint8_t uuid[37]; uint64_t ncsUUID64; } cndevUUID_t;
typedef struct {
    int64_t physicalMemoryTotal, physicalMemoryUsed, reservedMemory, virtualMemoryTotal, virtualMemoryUsed;
    uint64_t globalMemory;
    uint64_t reserved[16];
} cndevMemoryInfoV2_t;
typedef struct {
    int32_t version;
    int64_t physicalMemoryTotal, physicalMemoryUsed, virtualMemoryTotal, virtualMemoryUsed, channelNumber;
    int64_t channelMemoryUsed[20];
    uint64_t globalMemory;
} cndevMemoryInfo_t;
typedef struct { int32_t version; int32_t health; int32_t deviceState; int32_t driverState; int32_t reserved[16]; }
    cndevCardHealthState_t;
typedef struct { int32_t version; int32_t count; } cndevCardCoreCount_t;
typedef struct { int32_t version; int32_t nodeId; } cndevNUMANodeId_t;

typedef struct { int32_t version; uint32_t pid; uint64_t physicalMemoryUsed, virtualMemoryUsed; } cndevProcessInfo_t;

typedef int32_t cndevMluInstance_t;
typedef enum { CNDEV_FEATURE_DISABLED = 0, CNDEV_FEATURE_ENABLED = 1 } cndevEnableStatusEnum_t;
typedef struct { int32_t version; cndevEnableStatusEnum_t smluMode; } cndevSMLUMode_t;
typedef struct { int32_t version; uint32_t mluQuota; uint64_t memorySize; } cndevSMluSet_t;
enum { CNDEV_SMLU_MAX = 0, CNDEV_SMLU_USAGE = 1, CNDEV_SMLU_ITEM_COUNT };
#define NAME_SIZE 100
typedef struct {
    int32_t version;
    int32_t profileId;
    int32_t instanceId;
    uint8_t uuid[37];
    int32_t domain, bus, device, function;
    char profileName[NAME_SIZE];
    char instanceName[NAME_SIZE];
    char devNodeName[NAME_SIZE];
    uint32_t mluQuota[CNDEV_SMLU_ITEM_COUNT];
    uint64_t memorySize[CNDEV_SMLU_ITEM_COUNT];
    uint32_t reserved[128];
} cndevSMluInfo_t;
typedef struct { int32_t version; int32_t count; int32_t profileId[128]; } cndevSMluProfileIdInfo_t;
typedef struct {
    int32_t version;
    int32_t profileId;
    char name[NAME_SIZE];
    uint32_t totalCapacity;
    uint32_t remainCapacity;
    uint32_t mluQuota[CNDEV_SMLU_ITEM_COUNT];
    uint64_t memorySize[CNDEV_SMLU_ITEM_COUNT];
} cndevSMluProfileInfo_t;
typedef enum { CNDEV_MLULINK_MAC_STATE_DOWN = 0, CNDEV_MLULINK_MAC_STATE_UP = 1 } cndevMLULinkMACStateEnum_t;
typedef struct {
    cndevMLULinkMACStateEnum_t macState;
    int32_t serdesState;
    int32_t presenceState;
    uint32_t serdesProgress;
    uint32_t reserved[7];
} cndevMLULinkStatusV2_t;
typedef struct {
    int32_t version;
    uint64_t mcSn, baSn;
    uint32_t slotId, portId;
    uint8_t devIp[16];
    uint8_t uuid[37];
    uint32_t devIpVersion, isIpValid;
    int32_t connectType;
    uint64_t ncsUUID64;
    uint8_t mac_addr[6];
    char port_name[256];
} cndevMLULinkRemoteInfo_t;

#define MAX_PORTS 8
struct card {
    char uuid[37]; char name[64]; long memory; int cores; int health; int smlu; int numa;
    int nports; char peer[MAX_PORTS][37];
};
static struct card cards[MAX_CARDS];
static int ncards = -1;

static int failing(const char *call) {
    const char *f = getenv("FAKE_CNDEV_FAIL");
    return f != NULL && strcmp(f, call) == 0;
}

static void load(void) {
    ncards = 0;
    const char *path = getenv("FAKE_CNDEV_CONFIG");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (f == NULL) return;
    char line[1024];
    while (ncards < MAX_CARDS && fgets(line, sizeof line, f) != NULL) {
        struct card *c = &cards[ncards];
        char links[600] = "";
        c->smlu = 1;
        c->numa = 0;
        int n = sscanf(line, "%36s %63s %ld %d %d %d %599s %d", c->uuid, c->name, &c->memory, &c->cores, &c->health,
                       &c->smlu, links, &c->numa);
        if (n < 5) break;
        if (strcmp(links, "-") == 0) links[0] = '\0';
        c->nports = 0;
        for (char *save = NULL, *p = strtok_r(links, ",", &save); p != NULL && c->nports < MAX_PORTS;
             p = strtok_r(NULL, ",", &save)) {
            snprintf(c->peer[c->nports++], sizeof c->peer[0], "%s", p);
        }
        ncards++;
    }
    fclose(f);
}

/* The card's memory in use, MB, from the readings file (0 where not given). */
static int64_t memory_used_mb(cndevDevice_t dev) {
    struct fake_reading r;
    if (fake_reading("FAKE_CNDEV_READINGS", dev, &r) <= 0 || r.memory_used == FAKE_UNSUPPORTED) return 0;
    return (int64_t)(r.memory_used >> 20);
}

static cndevRet_t check(cndevDevice_t dev, const void *out, const char *call) {
    if (ncards < 0) return CNDEV_ERROR_UNINITIALIZED;
    if (out == NULL) return CNDEV_ERROR_INVALID_ARGUMENT;
    if (dev < 0 || dev >= ncards) return CNDEV_ERROR_INVALID_DEVICE_ID;
    if (failing(call)) return CNDEV_ERROR_UNKNOWN;
    return CNDEV_SUCCESS;
}

EXPORT cndevRet_t cndevInit(int32_t reserved) {
    (void)reserved;
    if (getenv("FAKE_CNDEV_NO_INIT")) return CNDEV_ERROR_NO_DRIVER;
    load();
    return CNDEV_SUCCESS;
}

/* *count: the room in `infos` on the way in, the number of processes on the way out; too little room gives
 * CNDEV_ERROR_INSUFFICIENT_SPACE with the number needed. Memory in KiB. */
EXPORT cndevRet_t cndevGetProcessInfo(uint32_t *count, cndevProcessInfo_t *infos, cndevDevice_t dev) {
    cndevRet_t r = check(dev, count, "cndevGetProcessInfo");
    if (r != CNDEV_SUCCESS) return r;
    struct fake_process found[256];
    int n = fake_processes("FAKE_CNDEV_PROCESSES", dev, found, 256);
    if (n < 0 || n > 256) return CNDEV_ERROR_UNKNOWN;
    if (*count < (uint32_t)n || (n > 0 && infos == NULL)) {
        *count = (uint32_t)n;
        return CNDEV_ERROR_INSUFFICIENT_SPACE;
    }
    *count = (uint32_t)n;
    for (int i = 0; i < n; i++) {
        infos[i].pid = found[i].pid;
        infos[i].physicalMemoryUsed = found[i].bytes >> 10;
        infos[i].virtualMemoryUsed = found[i].bytes >> 10;
    }
    return CNDEV_SUCCESS;
}

EXPORT cndevRet_t cndevRelease(void) { ncards = -1; return CNDEV_SUCCESS; }

EXPORT cndevRet_t cndevGetDeviceCount(cndevCardInfo_t *info) {
    if (ncards < 0) return CNDEV_ERROR_UNINITIALIZED;
    if (info == NULL) return CNDEV_ERROR_INVALID_ARGUMENT;
    if (failing("cndevGetDeviceCount")) return CNDEV_ERROR_UNKNOWN;
    info->number = (uint32_t)ncards;
    return CNDEV_SUCCESS;
}

EXPORT cndevRet_t cndevGetDeviceHandleByIndex(int32_t index, cndevDevice_t *handle) {
    cndevRet_t r = check(index, handle, "cndevGetDeviceHandleByIndex");
    if (r == CNDEV_SUCCESS) *handle = index;
    return r;
}

EXPORT cndevRet_t cndevGetUUID(cndevUUID_t *info, cndevDevice_t dev) {
    cndevRet_t r = check(dev, info, "cndevGetUUID");
    if (r != CNDEV_SUCCESS) return r;
    memset(info->uuid, 0, sizeof info->uuid);
    memcpy(info->uuid, cards[dev].uuid, strlen(cards[dev].uuid));
    info->ncsUUID64 = (uint64_t)dev + 1;
    return r;
}

EXPORT const char *cndevGetCardNameStringByDevId(cndevDevice_t dev) {
    if (ncards < 0 || dev < 0 || dev >= ncards) return "Unknown";
    return cards[dev].name;
}

#ifndef OLD_DRIVER
EXPORT cndevRet_t cndevGetMemoryUsageV2(cndevMemoryInfoV2_t *info, cndevDevice_t dev) {
    cndevRet_t r = check(dev, info, "cndevGetMemoryUsageV2");
    if (r != CNDEV_SUCCESS) return r;
    memset(info, 0, sizeof *info);
    info->physicalMemoryTotal = cards[dev].memory;
    info->physicalMemoryUsed = memory_used_mb(dev);
    info->virtualMemoryTotal = cards[dev].memory;
    return r;
}
#endif

EXPORT cndevRet_t cndevGetMemoryUsage(cndevMemoryInfo_t *info, cndevDevice_t dev) {
    cndevRet_t r = check(dev, info, "cndevGetMemoryUsage");
    if (r != CNDEV_SUCCESS) return r;
    int32_t version = info->version;
    memset(info, 0, sizeof *info);
    info->version = version;
    info->physicalMemoryTotal = cards[dev].memory;
    info->physicalMemoryUsed = memory_used_mb(dev);
    info->virtualMemoryTotal = cards[dev].memory;
    return r;
}

typedef struct {
    int32_t version, averageCoreUtilization, coreUtilization[80];
} cndevUtilizationInfo_t;
typedef struct {
    int32_t usage, cap, machine, tdp, maxPower, reserved[16]; /* W */
} cndevDevicePowerInfo_t;
typedef struct {
    int32_t version, board, cluster[20], memoryDie[8], chip, airInlet, airOutlet, memory, videoInput, cpu, isp;
} cndevTemperatureInfo_t;

/* Figure `which` (0 busy, 1 power, 2 temperature) of card `dev`, or -1 where "-" (not supported). */
static int figure(cndevDevice_t dev, int which, long long *out) {
    struct fake_reading r;
    if (fake_reading("FAKE_CNDEV_READINGS", dev, &r) < 0) return -1;
    *out = which == 0 ? r.busy : which == 1 ? r.power_mw : r.celsius;
    return *out == FAKE_UNSUPPORTED ? -1 : 0;
}

EXPORT cndevRet_t cndevGetDeviceUtilizationInfo(cndevUtilizationInfo_t *info, cndevDevice_t dev) {
    cndevRet_t r = check(dev, info, "cndevGetDeviceUtilizationInfo");
    long long busy;
    if (r != CNDEV_SUCCESS) return r;
    if (info->version != 6) return CNDEV_ERROR_INVALID_ARGUMENT;
    if (figure(dev, 0, &busy) < 0) return CNDEV_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->version = 6;
    info->averageCoreUtilization = (int32_t)busy;
    for (int i = 0; i < cards[dev].cores && i < 80; i++) info->coreUtilization[i] = (int32_t)busy;
    return r;
}

EXPORT cndevRet_t cndevGetDevicePowerInfo(cndevDevicePowerInfo_t *info, cndevDevice_t dev) {
    cndevRet_t r = check(dev, info, "cndevGetDevicePowerInfo");
    long long milliwatts;
    if (r != CNDEV_SUCCESS) return r;
    if (figure(dev, 1, &milliwatts) < 0) return CNDEV_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->usage = (int32_t)(milliwatts / 1000);
    info->cap = 250;
    return r;
}

EXPORT cndevRet_t cndevGetTemperatureInfo(cndevTemperatureInfo_t *info, cndevDevice_t dev) {
    cndevRet_t r = check(dev, info, "cndevGetTemperatureInfo");
    long long celsius;
    if (r != CNDEV_SUCCESS) return r;
    if (info->version != 6) return CNDEV_ERROR_INVALID_ARGUMENT;
    if (figure(dev, 2, &celsius) < 0) return CNDEV_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->version = 6;
    info->board = (int32_t)celsius;
    info->chip = (int32_t)celsius;
    return r;
}

EXPORT cndevRet_t cndevGetCardHealthState(cndevCardHealthState_t *info, cndevDevice_t dev) {
    cndevRet_t r = check(dev, info, "cndevGetCardHealthState");
    if (r == CNDEV_SUCCESS) info->health = cards[dev].health;
    return r;
}

EXPORT cndevRet_t cndevGetCoreCount(cndevCardCoreCount_t *info, cndevDevice_t dev) {
    cndevRet_t r = check(dev, info, "cndevGetCoreCount");
    if (r == CNDEV_SUCCESS) info->count = cards[dev].cores;
    return r;
}

#ifndef OLD_DRIVER
EXPORT cndevRet_t cndevGetNUMANodeIdByDevId(cndevNUMANodeId_t *numa, cndevDevice_t dev) {
    cndevRet_t r = check(dev, numa, "cndevGetNUMANodeIdByDevId");
    if (r == CNDEV_SUCCESS) numa->nodeId = cards[dev].numa;
    return r;
}

/* ---------------------------------------------------------------------------------------------- sMLU */

#define MAX_PROFILES 128
#define MAX_INSTANCES 128
struct profile { int card; int id; uint32_t quota; uint64_t memory; };
struct instance { int card; int id; int profile; char name[NAME_SIZE]; };
static struct profile profiles[MAX_PROFILES];
static struct instance instances[MAX_INSTANCES];
static int nprofiles, ninstances;

static void state_read(void) {
    const char *path = getenv("FAKE_CNDEV_STATE");
    if (path == NULL) return; /* kept in this process only */
    nprofiles = ninstances = 0;
    FILE *f = fopen(path, "r");
    if (f == NULL) return;
    char line[256];
    while (fgets(line, sizeof line, f) != NULL) {
        struct profile *p = &profiles[nprofiles];
        struct instance *i = &instances[ninstances];
        unsigned long long memory;
        if (nprofiles < MAX_PROFILES &&
            sscanf(line, "P %d %d %u %llu", &p->card, &p->id, &p->quota, &memory) == 4) {
            p->memory = memory;
            nprofiles++;
        } else if (ninstances < MAX_INSTANCES &&
                   sscanf(line, "I %d %d %d %99s", &i->card, &i->id, &i->profile, i->name) >= 3) {
            if (strcmp(i->name, "-") == 0) i->name[0] = '\0';
            ninstances++;
        }
    }
    fclose(f);
}

static void state_write(void) {
    const char *path = getenv("FAKE_CNDEV_STATE");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (f == NULL) return;
    for (int k = 0; k < nprofiles; k++)
        fprintf(f, "P %d %d %u %llu\n", profiles[k].card, profiles[k].id, profiles[k].quota,
                (unsigned long long)profiles[k].memory);
    for (int k = 0; k < ninstances; k++)
        fprintf(f, "I %d %d %d %s\n", instances[k].card, instances[k].id, instances[k].profile,
                instances[k].name[0] ? instances[k].name : "-");
    fclose(f);
}

static struct profile *profile_of(int card, int id) {
    for (int k = 0; k < nprofiles; k++)
        if (profiles[k].card == card && profiles[k].id == id) return &profiles[k];
    return NULL;
}

static void card_used(int card, uint32_t *quota, uint64_t *memory) {
    *quota = 0;
    *memory = 0;
    for (int k = 0; k < ninstances; k++) {
        struct profile *p = instances[k].card == card ? profile_of(card, instances[k].profile) : NULL;
        if (p != NULL) {
            *quota += p->quota;
            *memory += p->memory;
        }
    }
}

static uint32_t remain_of(const struct profile *p) {
    uint32_t quota;
    uint64_t memory;
    card_used(p->card, &quota, &memory);
    uint64_t total = (uint64_t)cards[p->card].memory * 1024 * 1024;
    uint32_t by_quota = (100 - quota) / p->quota;
    uint64_t by_memory = memory > total ? 0 : (total - memory) / p->memory;
    return by_quota < by_memory ? by_quota : (uint32_t)by_memory;
}

static cndevRet_t smlu_check(cndevDevice_t dev, const void *out, const char *call) {
    cndevRet_t r = check(dev, out, call);
    if (r != CNDEV_SUCCESS) return r;
    if (!cards[dev].smlu) return CNDEV_ERROR_NOT_SUPPORTED;
    state_read();
    return CNDEV_SUCCESS;
}

EXPORT cndevRet_t cndevGetSMLUMode(cndevSMLUMode_t *mode, cndevDevice_t dev) {
    cndevRet_t r = check(dev, mode, "cndevGetSMLUMode");
    if (r == CNDEV_SUCCESS) mode->smluMode = cards[dev].smlu ? CNDEV_FEATURE_ENABLED : CNDEV_FEATURE_DISABLED;
    return r;
}

EXPORT cndevRet_t cndevGetSMluProfileIdInfo(cndevSMluProfileIdInfo_t *info, cndevDevice_t dev) {
    cndevRet_t r = smlu_check(dev, info, "cndevGetSMluProfileIdInfo");
    if (r != CNDEV_SUCCESS) return r;
    info->count = 0;
    for (int k = 0; k < nprofiles; k++)
        if (profiles[k].card == dev) info->profileId[info->count++] = profiles[k].id;
    return r;
}

EXPORT cndevRet_t cndevGetSMluProfileInfo(cndevSMluProfileInfo_t *info, int32_t profile, cndevDevice_t dev) {
    cndevRet_t r = smlu_check(dev, info, "cndevGetSMluProfileInfo");
    if (r != CNDEV_SUCCESS) return r;
    struct profile *p = profile_of(dev, profile);
    if (p == NULL) return CNDEV_ERROR_NOT_FOUND;
    uint32_t used = 0;
    for (int k = 0; k < ninstances; k++) used += instances[k].card == dev && instances[k].profile == profile;
    info->profileId = p->id;
    snprintf(info->name, sizeof info->name, "%u.%llumb", p->quota, (unsigned long long)(p->memory >> 20));
    info->remainCapacity = remain_of(p);
    info->totalCapacity = used + info->remainCapacity;
    info->mluQuota[CNDEV_SMLU_MAX] = p->quota;
    info->memorySize[CNDEV_SMLU_MAX] = p->memory;
    return r;
}

EXPORT cndevRet_t cndevCreateSMluProfileInfo(cndevSMluSet_t *set, int32_t *profileId, cndevDevice_t dev) {
    cndevRet_t r = smlu_check(dev, set, "cndevCreateSMluProfileInfo");
    if (r != CNDEV_SUCCESS) return r;
    if (profileId == NULL || set->mluQuota == 0 || set->mluQuota > 100 || set->memorySize == 0 ||
        set->memorySize > (uint64_t)cards[dev].memory * 1024 * 1024)
        return CNDEV_ERROR_INVALID_ARGUMENT;
    int id = 0;
    for (int k = 0; k < nprofiles; k++) {
        if (profiles[k].card != dev) continue;
        if (profiles[k].quota == set->mluQuota && profiles[k].memory == set->memorySize) return CNDEV_ERROR_DUPLICATE;
        if (profiles[k].id > id) id = profiles[k].id;
    }
    if (nprofiles == MAX_PROFILES) return CNDEV_ERROR_INSUFFICIENT_SPACE;
    profiles[nprofiles++] = (struct profile){dev, id + 1, set->mluQuota, set->memorySize};
    *profileId = id + 1;
    state_write();
    return r;
}

EXPORT cndevRet_t cndevDestroySMluProfileInfo(int32_t profileId, cndevDevice_t dev) {
    cndevRet_t r = smlu_check(dev, &profileId, "cndevDestroySMluProfileInfo");
    if (r != CNDEV_SUCCESS) return r;
    for (int k = 0; k < ninstances; k++)
        if (instances[k].card == dev && instances[k].profile == profileId) return CNDEV_ERROR_IN_USE;
    for (int k = 0; k < nprofiles; k++) {
        if (profiles[k].card == dev && profiles[k].id == profileId) {
            profiles[k] = profiles[--nprofiles];
            state_write();
            return CNDEV_SUCCESS;
        }
    }
    return CNDEV_ERROR_NOT_FOUND;
}

EXPORT cndevRet_t cndevCreateSMluInstanceByProfileId(cndevMluInstance_t *handle, uint32_t profileId, cndevDevice_t dev,
                                                     char *instanceName) {
    cndevRet_t r = smlu_check(dev, handle, "cndevCreateSMluInstanceByProfileId");
    if (r != CNDEV_SUCCESS) return r;
    struct profile *p = profile_of(dev, (int)profileId);
    if (p == NULL) return CNDEV_ERROR_NOT_FOUND;
    const char *name = instanceName ? instanceName : "";
    if (strlen(name) >= NAME_SIZE || strchr(name, ' ') != NULL) return CNDEV_ERROR_INVALID_ARGUMENT;
    int id = 1;
    for (int k = 0; k < ninstances; k++) {
        if (instances[k].card != dev) continue;
        if (name[0] && strcmp(instances[k].name, name) == 0) return CNDEV_ERROR_DUPLICATE;
    }
    for (int taken = 1; taken;) {
        taken = 0;
        for (int k = 0; k < ninstances; k++)
            if (instances[k].card == dev && instances[k].id == id) taken = 1;
        if (taken) id++;
    }
    if (ninstances == MAX_INSTANCES || remain_of(p) < 1) return CNDEV_ERROR_INSUFFICIENT_SPACE;
    struct instance *i = &instances[ninstances++];
    *i = (struct instance){dev, id, p->id, ""};
    snprintf(i->name, sizeof i->name, "%s", name);
    *handle = id << 8 | dev;
    state_write();
    return r;
}

static cndevRet_t destroy_at(int k) {
    instances[k] = instances[--ninstances];
    state_write();
    return CNDEV_SUCCESS;
}

EXPORT cndevRet_t cndevDestroySMluInstanceByHandle(cndevMluInstance_t handle) {
    int dev = handle & 0xff;
    cndevRet_t r = smlu_check(dev, &handle, "cndevDestroySMluInstanceByHandle");
    if (r != CNDEV_SUCCESS) return r;
    for (int k = 0; k < ninstances; k++)
        if (instances[k].card == dev && instances[k].id == handle >> 8) return destroy_at(k);
    return CNDEV_ERROR_NOT_FOUND;
}

EXPORT cndevRet_t cndevDestroySMluInstanceByInstanceName(cndevDevice_t dev, char *instanceName) {
    cndevRet_t r = smlu_check(dev, instanceName, "cndevDestroySMluInstanceByInstanceName");
    if (r != CNDEV_SUCCESS) return r;
    for (int k = 0; k < ninstances; k++)
        if (instances[k].card == dev && instanceName[0] && strcmp(instances[k].name, instanceName) == 0)
            return destroy_at(k);
    return CNDEV_ERROR_NOT_FOUND;
}

EXPORT cndevRet_t cndevGetAllSMluInstanceInfo(int32_t *count, cndevSMluInfo_t *infos, cndevDevice_t dev) {
    cndevRet_t r = smlu_check(dev, count, "cndevGetAllSMluInstanceInfo");
    if (r != CNDEV_SUCCESS) return r;
    if (infos == NULL) return CNDEV_ERROR_INVALID_ARGUMENT;
    int n = 0;
    for (int k = 0; k < ninstances; k++) n += instances[k].card == dev;
    if (*count < n) {
        *count = n;
        return CNDEV_ERROR_INSUFFICIENT_SPACE;
    }
    *count = n;
    int out = 0;
    for (int k = 0; k < ninstances; k++) {
        struct instance *i = &instances[k];
        if (i->card != dev) continue;
        struct profile *p = profile_of(dev, i->profile);
        cndevSMluInfo_t *info = &infos[out++];
        int32_t version = info->version;
        memset(info, 0, sizeof *info);
        info->version = version;
        info->profileId = i->profile;
        info->instanceId = i->id;
        char uuid[37];
        snprintf(uuid, sizeof uuid, "%.24s%04d%08d", cards[dev].uuid, dev, i->id);
        memcpy(info->uuid, uuid, strlen(uuid));
        if (p != NULL) {
            snprintf(info->profileName, sizeof info->profileName, "%u.%llumb", p->quota,
                     (unsigned long long)(p->memory >> 20));
            info->mluQuota[CNDEV_SMLU_MAX] = p->quota;
            info->memorySize[CNDEV_SMLU_MAX] = p->memory;
        }
        snprintf(info->instanceName, sizeof info->instanceName, "%s", i->name);
        snprintf(info->devNodeName, sizeof info->devNodeName, "/dev/cambricon-caps/cap_dev%d_mi%d", dev, i->id);
    }
    return r;
}

/* ------------------------------------------------------------------------------------------ MLU-Link */

EXPORT int32_t cndevGetMLULinkPortNumber(cndevDevice_t dev) {
    if (ncards < 0 || dev < 0 || dev >= ncards) return 0;
    return cards[dev].nports;
}

EXPORT cndevRet_t cndevGetMLULinkStatusV2(cndevMLULinkStatusV2_t *status, cndevDevice_t dev, int32_t link) {
    cndevRet_t r = check(dev, status, "cndevGetMLULinkStatusV2");
    if (r != CNDEV_SUCCESS) return r;
    if (link < 0 || link >= cards[dev].nports) return CNDEV_ERROR_INVALID_LINK;
    memset(status, 0, sizeof *status);
    status->macState = strcmp(cards[dev].peer[link], "-") == 0 ? CNDEV_MLULINK_MAC_STATE_DOWN : CNDEV_MLULINK_MAC_STATE_UP;
    return r;
}

EXPORT cndevRet_t cndevGetMLULinkRemoteInfo(cndevMLULinkRemoteInfo_t *info, cndevDevice_t dev, int32_t link) {
    cndevRet_t r = check(dev, info, "cndevGetMLULinkRemoteInfo");
    if (r != CNDEV_SUCCESS) return r;
    if (link < 0 || link >= cards[dev].nports) return CNDEV_ERROR_INVALID_LINK;
    int32_t version = info->version;
    memset(info, 0, sizeof *info);
    info->version = version;
    info->portId = (uint32_t)link;
    if (strcmp(cards[dev].peer[link], "-") != 0)
        memcpy(info->uuid, cards[dev].peer[link], strlen(cards[dev].peer[link]));
    return r;
}
#endif
