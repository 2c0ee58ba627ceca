/*
 * fake_amdsmi.c: a fake AMD SMI (libamd_smi.so) for the AMD tests, written from amdsmi.h (ROCm/amdsmi,
 * include/amd_smi/amdsmi.h): amdsmi_init, amdsmi_shut_down, amdsmi_get_socket_handles,
 * amdsmi_get_processor_handles, amdsmi_get_gpu_device_uuid, amdsmi_get_gpu_device_bdf, amdsmi_get_gpu_asic_info,
 * amdsmi_get_gpu_memory_total and amdsmi_topo_get_numa_node_number, with the header's types, status codes and
 * struct layouts (amdsmi_bdf_t's bit fields, amdsmi_asic_info_t).
 *
 * The machine is read at every call from the file $FAKE_AMDSMI_MACHINE, else fake_amdsmi.machine beside the
 * library, one GPU per line:
 *   <socket> <uuid> <domain> <bus hex> <device hex> <function> <compute units> <vram bytes> <numa> <market name...>
 * GPUs of one socket number are that socket's processors, sockets in order of first appearance. FAKE_AMDSMI_FAIL=
 * <function> makes that function answer AMDSMI_STATUS_NOT_SUPPORTED (amdsmi_init: AMDSMI_STATUS_INIT_ERROR), and
 * FAKE_AMDSMI_FAIL_UUID=<uuid> makes every per-GPU call for that GPU fail.
 *
 * The readings (amdsmi_get_gpu_memory_usage of VRAM, bytes; amdsmi_get_gpu_activity's gfx_activity, percent;
 * amdsmi_get_power_info's current_socket_power, watts, average_socket_power UINT32_MAX as on MI300;
 * amdsmi_get_temp_metric of the edge sensor's current temperature, degrees) answer from the file
 * $FAKE_AMDSMI_READINGS names (core's fake_readings.h, the device index being the GPU's line; "-":
 * AMDSMI_STATUS_NOT_SUPPORTED, or nothing in use for the memory).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_readings.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_GPU 32
#define AMDSMI_MAX_STRING_LENGTH 64
#define AMDSMI_NORMAL_STRING_LENGTH 32
#define AMDSMI_256_LENGTH 256
#define AMDSMI_GPU_UUID_SIZE 38

typedef enum {
    AMDSMI_STATUS_SUCCESS = 0,
    AMDSMI_STATUS_INVAL = 1,
    AMDSMI_STATUS_NOT_SUPPORTED = 2,
    AMDSMI_STATUS_NOT_INIT = 32,
    AMDSMI_STATUS_INIT_ERROR = 18,
} amdsmi_status_t;

typedef enum { AMDSMI_MEM_TYPE_VRAM = 0, AMDSMI_MEM_TYPE_VIS_VRAM = 1, AMDSMI_MEM_TYPE_GTT = 2 } amdsmi_memory_type_t;
typedef void *amdsmi_processor_handle;
typedef void *amdsmi_socket_handle;

typedef union {
    struct {
        uint64_t function_number : 3;
        uint64_t device_number : 5;
        uint64_t bus_number : 8;
        uint64_t domain_number : 48;
    };
    uint64_t as_uint;
} amdsmi_bdf_t;

typedef struct {
    char market_name[AMDSMI_256_LENGTH];
    uint32_t vendor_id;
    char vendor_name[AMDSMI_MAX_STRING_LENGTH];
    uint32_t subvendor_id;
    uint64_t device_id;
    uint32_t rev_id;
    char asic_serial[AMDSMI_NORMAL_STRING_LENGTH];
    uint32_t oam_id;
    uint32_t num_of_compute_units;
    uint64_t target_graphics_version;
    uint32_t reserved[15];
} amdsmi_asic_info_t;

struct gpu {
    int socket;
    char uuid[AMDSMI_GPU_UUID_SIZE + 8];
    unsigned domain, bus, device, function;
    unsigned cus;
    unsigned long long vram;
    unsigned numa;
    char name[AMDSMI_256_LENGTH];
};

static int g_init;

static int failing(const char *name) {
    const char *fail = getenv("FAKE_AMDSMI_FAIL");
    return fail && strcmp(fail, name) == 0;
}

static int load(struct gpu *out) {
    const char *path = getenv("FAKE_AMDSMI_MACHINE");
    char beside[4096];
    Dl_info self;
    if (!path && dladdr((void *)&load, &self) && self.dli_fname) {
        snprintf(beside, sizeof beside, "%s", self.dli_fname);
        char *slash = strrchr(beside, '/');
        if (slash) snprintf(slash + 1, sizeof beside - (size_t)(slash + 1 - beside), "fake_amdsmi.machine");
        path = beside;
    }
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return 0;
    int n = 0;
    char line[512];
    while (n < MAX_GPU && fgets(line, sizeof line, f)) {
        struct gpu g;
        int used = 0;
        memset(&g, 0, sizeof g);
        if (sscanf(line, "%d %45s %x %x %x %x %u %llu %u %n", &g.socket, g.uuid, &g.domain, &g.bus, &g.device,
                   &g.function, &g.cus, &g.vram, &g.numa, &used) < 9)
            continue;
        snprintf(g.name, sizeof g.name, "%s", line + used);
        g.name[strcspn(g.name, "\n")] = 0;
        out[n++] = g;
    }
    fclose(f);
    return n;
}

static int sockets(const struct gpu *gpus, int n, int *ids) {
    int count = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < count; j++) seen |= ids[j] == gpus[i].socket;
        if (!seen) ids[count++] = gpus[i].socket;
    }
    return count;
}

EXPORT amdsmi_status_t amdsmi_init(uint64_t flags) {
    if (failing("amdsmi_init") || !(flags & (1 << 1))) return AMDSMI_STATUS_INIT_ERROR;
    g_init = 1;
    return AMDSMI_STATUS_SUCCESS;
}

EXPORT amdsmi_status_t amdsmi_shut_down(void) {
    g_init = 0;
    return AMDSMI_STATUS_SUCCESS;
}

EXPORT amdsmi_status_t amdsmi_get_socket_handles(uint32_t *socket_count, amdsmi_socket_handle *socket_handles) {
    if (!g_init) return AMDSMI_STATUS_NOT_INIT;
    if (failing("amdsmi_get_socket_handles")) return AMDSMI_STATUS_NOT_SUPPORTED;
    if (!socket_count) return AMDSMI_STATUS_INVAL;
    struct gpu gpus[MAX_GPU];
    int ids[MAX_GPU];
    int count = sockets(gpus, load(gpus), ids);
    if (!socket_handles) {
        *socket_count = (uint32_t)count;
        return AMDSMI_STATUS_SUCCESS;
    }
    uint32_t written = 0;
    for (int i = 0; i < count && written < *socket_count; i++)
        socket_handles[written++] = (amdsmi_socket_handle)(uintptr_t)(0x1000 + ids[i]);
    *socket_count = written;
    return AMDSMI_STATUS_SUCCESS;
}

EXPORT amdsmi_status_t amdsmi_get_processor_handles(amdsmi_socket_handle socket_handle, uint32_t *processor_count,
                                                    amdsmi_processor_handle *processor_handles) {
    if (!g_init) return AMDSMI_STATUS_NOT_INIT;
    if (failing("amdsmi_get_processor_handles")) return AMDSMI_STATUS_NOT_SUPPORTED;
    if (!processor_count) return AMDSMI_STATUS_INVAL;
    struct gpu gpus[MAX_GPU];
    int n = load(gpus);
    int socket = (int)((uintptr_t)socket_handle - 0x1000);
    uint32_t found = 0, written = 0;
    for (int i = 0; i < n; i++) {
        if (gpus[i].socket != socket) continue;
        found++;
        if (processor_handles && written < *processor_count)
            processor_handles[written++] = (amdsmi_processor_handle)(uintptr_t)(i + 1);
    }
    *processor_count = processor_handles ? written : found;
    return AMDSMI_STATUS_SUCCESS;
}

#define GPU_OR_FAIL(name)                                                                                      \
    struct gpu gpus[MAX_GPU];                                                                                  \
    int n = load(gpus);                                                                                        \
    int at = (int)(uintptr_t)processor_handle - 1;                                                             \
    if (!g_init) return AMDSMI_STATUS_NOT_INIT;                                                                \
    if (at < 0 || at >= n) return AMDSMI_STATUS_INVAL;                                                         \
    const char *bad = getenv("FAKE_AMDSMI_FAIL_UUID");                                                         \
    if (failing(name) || (bad && strcmp(bad, gpus[at].uuid) == 0)) return AMDSMI_STATUS_NOT_SUPPORTED;         \
    const struct gpu *g = &gpus[at];

EXPORT amdsmi_status_t amdsmi_get_gpu_device_uuid(amdsmi_processor_handle processor_handle, unsigned int *uuid_length,
                                                  char *uuid) {
    GPU_OR_FAIL("amdsmi_get_gpu_device_uuid");
    if (!uuid_length || !uuid || *uuid_length < AMDSMI_GPU_UUID_SIZE) return AMDSMI_STATUS_INVAL;
    snprintf(uuid, *uuid_length, "%s", g->uuid);
    *uuid_length = (unsigned)strlen(uuid);
    return AMDSMI_STATUS_SUCCESS;
}

EXPORT amdsmi_status_t amdsmi_get_gpu_device_bdf(amdsmi_processor_handle processor_handle, amdsmi_bdf_t *bdf) {
    GPU_OR_FAIL("amdsmi_get_gpu_device_bdf");
    if (!bdf) return AMDSMI_STATUS_INVAL;
    bdf->as_uint = 0;
    bdf->function_number = g->function;
    bdf->device_number = g->device;
    bdf->bus_number = g->bus;
    bdf->domain_number = g->domain;
    return AMDSMI_STATUS_SUCCESS;
}

EXPORT amdsmi_status_t amdsmi_get_gpu_asic_info(amdsmi_processor_handle processor_handle, amdsmi_asic_info_t *info) {
    GPU_OR_FAIL("amdsmi_get_gpu_asic_info");
    if (!info) return AMDSMI_STATUS_INVAL;
    memset(info, 0, sizeof *info);
    snprintf(info->market_name, sizeof info->market_name, "%s", g->name);
    info->vendor_id = 0x1002;
    snprintf(info->vendor_name, sizeof info->vendor_name, "Advanced Micro Devices Inc. [AMD/ATI]");
    info->device_id = 0x74a1;
    info->oam_id = 0xFFFF;
    info->num_of_compute_units = g->cus;
    info->target_graphics_version = 0x942;
    return AMDSMI_STATUS_SUCCESS;
}

EXPORT amdsmi_status_t amdsmi_get_gpu_memory_total(amdsmi_processor_handle processor_handle,
                                                   amdsmi_memory_type_t mem_type, uint64_t *total) {
    GPU_OR_FAIL("amdsmi_get_gpu_memory_total");
    if (!total) return AMDSMI_STATUS_INVAL;
    *total = mem_type == AMDSMI_MEM_TYPE_VRAM ? g->vram : 512ULL << 20;
    return AMDSMI_STATUS_SUCCESS;
}

EXPORT amdsmi_status_t amdsmi_topo_get_numa_node_number(amdsmi_processor_handle processor_handle,
                                                        uint32_t *numa_node) {
    GPU_OR_FAIL("amdsmi_topo_get_numa_node_number");
    if (!numa_node) return AMDSMI_STATUS_INVAL;
    *numa_node = g->numa;
    return AMDSMI_STATUS_SUCCESS;
}

EXPORT amdsmi_status_t amdsmi_get_gpu_memory_usage(amdsmi_processor_handle processor_handle,
                                                   amdsmi_memory_type_t mem_type, uint64_t *used) {
    GPU_OR_FAIL("amdsmi_get_gpu_memory_usage");
    (void)g;
    struct fake_reading r;
    if (!used) return AMDSMI_STATUS_INVAL;
    if (fake_reading("FAKE_AMDSMI_READINGS", at, &r) < 0) return AMDSMI_STATUS_NOT_SUPPORTED;
    *used = mem_type != AMDSMI_MEM_TYPE_VRAM || r.memory_used == FAKE_UNSUPPORTED ? 0 : (uint64_t)r.memory_used;
    return AMDSMI_STATUS_SUCCESS;
}

typedef struct {
    uint32_t gfx_activity, umc_activity, mm_activity;
    uint32_t reserved[13];
} amdsmi_engine_usage_t;

typedef struct {
    uint64_t socket_power;
    uint32_t current_socket_power, average_socket_power;
    uint64_t gfx_voltage, soc_voltage, mem_voltage;
    uint32_t power_limit;
    uint64_t reserved[18];
} amdsmi_power_info_t;

typedef enum { AMDSMI_TEMPERATURE_TYPE_EDGE = 0 } amdsmi_temperature_type_t;
typedef enum { AMDSMI_TEMP_CURRENT = 0 } amdsmi_temperature_metric_t;

/* Figure `which` (0 busy, 1 power, 2 temperature) of GPU `at`, or -1 where the library does not support it. */
static int figure(int at, int which, long long *out) {
    struct fake_reading r;
    if (fake_reading("FAKE_AMDSMI_READINGS", at, &r) < 0) return -1;
    *out = which == 0 ? r.busy : which == 1 ? r.power_mw : r.celsius;
    return *out == FAKE_UNSUPPORTED ? -1 : 0;
}

EXPORT amdsmi_status_t amdsmi_get_gpu_activity(amdsmi_processor_handle processor_handle, amdsmi_engine_usage_t *info) {
    GPU_OR_FAIL("amdsmi_get_gpu_activity");
    (void)g;
    long long busy;
    if (!info) return AMDSMI_STATUS_INVAL;
    if (figure(at, 0, &busy) < 0) return AMDSMI_STATUS_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->gfx_activity = (uint32_t)busy;
    return AMDSMI_STATUS_SUCCESS;
}

EXPORT amdsmi_status_t amdsmi_get_power_info(amdsmi_processor_handle processor_handle, amdsmi_power_info_t *info) {
    GPU_OR_FAIL("amdsmi_get_power_info");
    (void)g;
    long long milliwatts;
    if (!info) return AMDSMI_STATUS_INVAL;
    if (figure(at, 1, &milliwatts) < 0) return AMDSMI_STATUS_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->socket_power = (uint64_t)(milliwatts / 1000);
    info->current_socket_power = (uint32_t)(milliwatts / 1000);
    info->average_socket_power = UINT32_MAX; /* "unsupported struct members are set to UINT32_MAX" (MI300) */
    info->power_limit = 750;
    return AMDSMI_STATUS_SUCCESS;
}

EXPORT amdsmi_status_t amdsmi_get_temp_metric(amdsmi_processor_handle processor_handle,
                                              amdsmi_temperature_type_t sensor_type,
                                              amdsmi_temperature_metric_t metric, int64_t *temperature) {
    GPU_OR_FAIL("amdsmi_get_temp_metric");
    (void)g;
    long long celsius;
    if (!temperature || sensor_type != AMDSMI_TEMPERATURE_TYPE_EDGE || metric != AMDSMI_TEMP_CURRENT)
        return AMDSMI_STATUS_INVAL;
    if (figure(at, 2, &celsius) < 0) return AMDSMI_STATUS_NOT_SUPPORTED;
    *temperature = celsius;
    return AMDSMI_STATUS_SUCCESS;
}
