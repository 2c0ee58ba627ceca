/* A fake EFML (libefml.so) for the Enflame tests, written from Enflame's efml.h: the legacy per-index API the
 * plugin's binding calls (EfmlInit, EfmlShutdown, EfmlErrorString, EfmlGetDevCount, EfmlGetDevName,
 * EfmlGetDevUuid, EfmlGetDevMem, EfmlGetDevIsHealth, EfmlGetDevInfo, EfmlGetNumaNode), with efml.h's structs and
 * return codes.
 *
 * The machine it pretends to be is read at EfmlInit from the file named by FAKE_EFML_CONFIG, one GCU per line:
 *   <uuid> <name> <memory MiB> <healthy 0|1> <domain:bus:dev.func hex> <numa>
 * A uuid of "-" makes EfmlGetDevUuid fail for that GCU (EFML_ERROR_FAIL); health "x" makes EfmlGetDevIsHealth
 * fail. Without the variable, or with FAKE_EFML_NO_DRIVER set, EfmlInit answers EFML_ERROR_DRIVER_NOT_LOADED.
 *
 * The readings (EfmlGetDevMem's mem_used, MiB; EfmlGetDevDtuUsage, percent as a float; EfmlGetDevPwr's
 * cur_pwr_consumption, W as a float; EfmlGetDevTemp's cur_dev_temp, degrees as a float) answer from the file
 * FAKE_EFML_READINGS names, re-read at every call (core's fake_readings.h, the device index being the GCU's line;
 * "-": EFML_ERROR_NOT_SUPPORTED, or nothing in use).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_readings.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_CHAR_BUFF_LEN 128
#define MAX_GCUS 16

typedef enum {
    EFML_SUCCESS = 0,
    EFML_ERROR_UNINITIALIZED = 1,
    EFML_ERROR_INVALID_ARGUMENT = 2,
    EFML_ERROR_NOT_SUPPORTED = 3,
    EFML_ERROR_DRIVER_NOT_LOADED = 6,
    EFML_ERROR_FAIL = 254,
} efmlReturn_t;

typedef struct {
    uint64_t mem_total_size;
    uint32_t mem_used;
} efmlDevMemInfo_t;

typedef struct {
    char name[MAX_CHAR_BUFF_LEN];
    uint32_t vendor_id;
    uint32_t device_id;
    uint32_t domain_id;
    uint32_t bus_id;
    uint32_t dev_id;
    uint32_t func_id;
    uint32_t logic_id;
} efmlDeviceInfo_t;

struct gcu {
    char uuid[MAX_CHAR_BUFF_LEN];
    char name[MAX_CHAR_BUFF_LEN];
    unsigned long long memory;
    char health[8];
    unsigned domain, bus, dev, func;
    int numa;
};

static struct gcu gcus[MAX_GCUS];
static uint32_t count;
static bool ready;

EXPORT efmlReturn_t EfmlInit(bool no_driver) {
    const char *path = getenv("FAKE_EFML_CONFIG");
    if (no_driver || path == NULL || getenv("FAKE_EFML_NO_DRIVER") != NULL) return EFML_ERROR_DRIVER_NOT_LOADED;
    FILE *f = fopen(path, "r");
    if (f == NULL) return EFML_ERROR_DRIVER_NOT_LOADED;
    count = 0;
    char line[512];
    while (count < MAX_GCUS && fgets(line, sizeof line, f) != NULL) {
        struct gcu *g = &gcus[count];
        if (sscanf(line, "%127s %127s %llu %7s %x:%x:%x.%x %d", g->uuid, g->name, &g->memory, g->health, &g->domain,
                   &g->bus, &g->dev, &g->func, &g->numa) == 9)
            count++;
    }
    fclose(f);
    ready = true;
    return EFML_SUCCESS;
}

EXPORT void EfmlShutdown(void) { ready = false; }

EXPORT efmlReturn_t EfmlErrorString(efmlReturn_t result, char *p_error_str) {
    const char *text = result == EFML_ERROR_DRIVER_NOT_LOADED ? "Error, driver not loaded"
                       : result == EFML_ERROR_FAIL            ? "Error, operate fail"
                       : result == EFML_ERROR_UNINITIALIZED   ? "Error, device un-initialized"
                                                              : "Error, invalid argument";
    snprintf(p_error_str, MAX_CHAR_BUFF_LEN, "%s", text);
    return EFML_SUCCESS;
}

static efmlReturn_t check(uint32_t dev_idx, const void *out) {
    if (!ready) return EFML_ERROR_UNINITIALIZED;
    return dev_idx >= count || out == NULL ? EFML_ERROR_INVALID_ARGUMENT : EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevCount(uint32_t *dev_count) {
    if (!ready) return EFML_ERROR_UNINITIALIZED;
    *dev_count = count;
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevName(uint32_t dev_idx, char *p_name) {
    efmlReturn_t r = check(dev_idx, p_name);
    if (r == EFML_SUCCESS) snprintf(p_name, MAX_CHAR_BUFF_LEN, "%s", gcus[dev_idx].name);
    return r;
}

EXPORT efmlReturn_t EfmlGetDevUuid(uint32_t dev_idx, char *p_info) {
    efmlReturn_t r = check(dev_idx, p_info);
    if (r != EFML_SUCCESS) return r;
    if (strcmp(gcus[dev_idx].uuid, "-") == 0) return EFML_ERROR_FAIL;
    snprintf(p_info, MAX_CHAR_BUFF_LEN, "%s", gcus[dev_idx].uuid);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevMem(uint32_t dev_idx, efmlDevMemInfo_t *p_mem) {
    efmlReturn_t r = check(dev_idx, p_mem);
    if (r == EFML_SUCCESS) {
        struct fake_reading f;
        if (fake_reading("FAKE_EFML_READINGS", (int)dev_idx, &f) < 0) return EFML_ERROR_FAIL;
        p_mem->mem_total_size = gcus[dev_idx].memory;
        p_mem->mem_used = f.memory_used == FAKE_UNSUPPORTED ? 0 : (uint32_t)(f.memory_used >> 20);
    }
    return r;
}

typedef struct {
    float pwr_capability, cur_pwr_consumption; /* W */
} efmlDevPowerInfo_t;
typedef struct {
    float cur_dev_temp, cur_hbm0_temp, cur_hbm1_temp; /* degrees Celsius */
} efmlDevThermalInfo_t;

/* Figure `which` (0 busy, 1 power, 2 temperature) of GCU `dev_idx`, EFML_ERROR_NOT_SUPPORTED where "-". */
static efmlReturn_t figure(uint32_t dev_idx, const void *out, int which, long long *value) {
    efmlReturn_t r = check(dev_idx, out);
    struct fake_reading f;
    if (r != EFML_SUCCESS) return r;
    if (fake_reading("FAKE_EFML_READINGS", (int)dev_idx, &f) < 0) return EFML_ERROR_FAIL;
    *value = which == 0 ? f.busy : which == 1 ? f.power_mw : f.celsius;
    return *value == FAKE_UNSUPPORTED ? EFML_ERROR_NOT_SUPPORTED : EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevDtuUsage(uint32_t dev_idx, float *p_data) {
    long long busy;
    efmlReturn_t r = figure(dev_idx, p_data, 0, &busy);
    if (r == EFML_SUCCESS) *p_data = (float)busy;
    return r;
}

EXPORT efmlReturn_t EfmlGetDevPwr(uint32_t dev_idx, efmlDevPowerInfo_t *p_pwr) {
    long long milliwatts;
    efmlReturn_t r = figure(dev_idx, p_pwr, 1, &milliwatts);
    if (r == EFML_SUCCESS) {
        p_pwr->pwr_capability = 300.0f;
        p_pwr->cur_pwr_consumption = (float)milliwatts / 1000.0f;
    }
    return r;
}

EXPORT efmlReturn_t EfmlGetDevTemp(uint32_t dev_idx, efmlDevThermalInfo_t *p_temp) {
    long long celsius;
    efmlReturn_t r = figure(dev_idx, p_temp, 2, &celsius);
    if (r == EFML_SUCCESS) {
        p_temp->cur_dev_temp = (float)celsius;
        p_temp->cur_hbm0_temp = p_temp->cur_hbm1_temp = (float)celsius;
    }
    return r;
}

EXPORT efmlReturn_t EfmlGetDevIsHealth(uint32_t dev_idx, bool *is_health) {
    efmlReturn_t r = check(dev_idx, is_health);
    if (r != EFML_SUCCESS) return r;
    if (strcmp(gcus[dev_idx].health, "x") == 0) return EFML_ERROR_FAIL;
    *is_health = strcmp(gcus[dev_idx].health, "1") == 0;
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevInfo(uint32_t dev_idx, efmlDeviceInfo_t *p_info) {
    efmlReturn_t r = check(dev_idx, p_info);
    if (r != EFML_SUCCESS) return r;
    memset(p_info, 0, sizeof *p_info);
    snprintf(p_info->name, MAX_CHAR_BUFF_LEN, "%s", gcus[dev_idx].name);
    p_info->vendor_id = 0x1e36;
    p_info->device_id = 0xc035;
    p_info->domain_id = gcus[dev_idx].domain;
    p_info->bus_id = gcus[dev_idx].bus;
    p_info->dev_id = gcus[dev_idx].dev;
    p_info->func_id = gcus[dev_idx].func;
    p_info->logic_id = dev_idx;
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetNumaNode(uint32_t dev_idx, int *numa_node) {
    efmlReturn_t r = check(dev_idx, numa_node);
    if (r == EFML_SUCCESS) *numa_node = gcus[dev_idx].numa;
    return r;
}
