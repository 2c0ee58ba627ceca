/* A fake libcndev.so, written from CNDev's documented interface (cndev.h): the calls the Cambricon plugin makes,
 * answering from a machine description in $FAKE_CNDEV_CONFIG, one card a line:
 *     <uuid> <card name> <memory MB> <MLU cores> <health: 1 healthy, 0 in trouble>
 * $FAKE_CNDEV_FAIL names one call that returns CNDEV_ERROR_UNKNOWN (7); $FAKE_CNDEV_NO_INIT makes cndevInit
 * answer CNDEV_ERROR_NO_DRIVER (1). Built with -DOLD_DRIVER it lacks cndevGetMemoryUsageV2, as older drivers do. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_CARDS 64

typedef enum {
    CNDEV_SUCCESS = 0,
    CNDEV_ERROR_NO_DRIVER = 1,
    CNDEV_ERROR_UNINITIALIZED = 4,
    CNDEV_ERROR_INVALID_ARGUMENT = 5,
    CNDEV_ERROR_INVALID_DEVICE_ID = 6,
    CNDEV_ERROR_UNKNOWN = 7,
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

struct card { char uuid[37]; char name[64]; long memory; int cores; int health; };
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
    while (ncards < MAX_CARDS) {
        struct card *c = &cards[ncards];
        if (fscanf(f, "%36s %63s %ld %d %d", c->uuid, c->name, &c->memory, &c->cores, &c->health) != 5) break;
        ncards++;
    }
    fclose(f);
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
    info->virtualMemoryTotal = cards[dev].memory;
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
