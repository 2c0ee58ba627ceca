/*
 * fake_dtk.c: a fake of DTK's management libraries for the Hygon tests, written from their documented API:
 * librocm_smi64.so (ROCm SMI, rocm_smi.h: rsmi_init, rsmi_num_monitor_devices, rsmi_dev_pci_id_get,
 * rsmi_dev_serial_number_get, rsmi_dev_id_get, rsmi_dev_memory_total_get / _usage_get,
 * rsmi_topo_numa_affinity_get, rsmi_shut_down) built with -DFAKE_RSMI, and libhydmi.so (Hygon DMI,
 * dmi_virtual.h: dmiGetDeviceCount, dmiGetDeviceInfo, dmiGetDeviceRemainingInfo, dmiGetVDeviceCount,
 * dmiGetVDeviceInfo, dmiCreateVDevices, dmiDestroySingleVDevice) built with -DFAKE_DMI.
 *
 * The machine is read from $FAKE_DTK_CONFIG at every call, one device per line:
 *   <domain> <bus> <dev> <fn> <serial> <device id hex> <vram total bytes> <vram used bytes> <cus> <numa>
 * The virtual devices live in $FAKE_DTK_STATE (one "<vdev id> <device> <cus> <mem MiB>" line each), so that
 * they outlive the process that created them, as the driver's do. FAKE_DTK_FAIL=<function> makes that function
 * fail (RSMI_STATUS_NOT_SUPPORTED / DMI_STATUS_ERROR).
 *
 * ROCm SMI's compute processes (rsmi_compute_process_info_get, rsmi_compute_process_gpus_get,
 * rsmi_compute_process_info_by_pid_get, and rsmi_compute_process_info_by_device_get unless built with
 * -DFAKE_RSMI_NO_BY_DEVICE, as older libraries lack it) answer from the process table $FAKE_DTK_PROCESSES names
 * (core's fake_processes.h; the device index is the device's line): a process's vram_usage is its bytes summed
 * over the devices it is listed on, as ROCm SMI sums a process's VRAM over its GPUs.
 *
 * The readings (rsmi_dev_memory_usage_get's VRAM in use, rsmi_dev_busy_percent_get, rsmi_dev_power_ave_get in
 * microwatts, rsmi_dev_temp_metric_get's current edge temperature in millidegrees) answer from the file
 * $FAKE_DTK_READINGS names (core's fake_readings.h; "-": RSMI_STATUS_NOT_SUPPORTED, or the machine's VRAM in use).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_processes.h"
#include "fake_readings.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEV 16
#define MAX_VDEV 64

struct dev {
    unsigned long long domain, bus, device, function;
    char serial[64];
    unsigned id;
    unsigned long long total, used;
    int cus, numa;
};

static int load(struct dev *out) {
    const char *path = getenv("FAKE_DTK_CONFIG");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return -1;
    int n = 0;
    while (n < MAX_DEV) {
        struct dev d;
        int got = fscanf(f, "%llu %llu %llu %llu %63s %x %llu %llu %d %d", &d.domain, &d.bus, &d.device, &d.function,
                         d.serial, &d.id, &d.total, &d.used, &d.cus, &d.numa);
        if (got != 10) break;
        out[n++] = d;
    }
    fclose(f);
    return n;
}

static int failing(const char *name) {
    const char *fail = getenv("FAKE_DTK_FAIL");
    return fail && strcmp(fail, name) == 0;
}

#ifdef FAKE_RSMI
typedef enum { RSMI_STATUS_SUCCESS = 0, RSMI_STATUS_INVALID_ARGS = 1, RSMI_STATUS_NOT_SUPPORTED = 2,
               RSMI_STATUS_INIT_ERROR = 8, RSMI_STATUS_NOT_FOUND = 10, RSMI_STATUS_INSUFFICIENT_SIZE = 11 } rsmi_status_t;
typedef enum { RSMI_MEM_TYPE_VRAM = 0, RSMI_MEM_TYPE_VIS_VRAM = 1, RSMI_MEM_TYPE_GTT = 2 } rsmi_memory_type_t;

static int g_init;

#define DEVICE_OR_FAIL(name, index)                                                                        \
    struct dev devs[MAX_DEV];                                                                              \
    int n = load(devs);                                                                                    \
    if (!g_init) return RSMI_STATUS_INIT_ERROR;                                                            \
    if (failing(name)) return RSMI_STATUS_NOT_SUPPORTED;                                                   \
    if ((int)(index) >= n) return RSMI_STATUS_INVALID_ARGS;                                                \
    struct dev *d = &devs[index];

EXPORT rsmi_status_t rsmi_init(uint64_t flags) {
    (void)flags;
    if (failing("rsmi_init") || !getenv("FAKE_DTK_CONFIG")) return RSMI_STATUS_INIT_ERROR;
    g_init = 1;
    return RSMI_STATUS_SUCCESS;
}

EXPORT rsmi_status_t rsmi_shut_down(void) {
    g_init = 0;
    return RSMI_STATUS_SUCCESS;
}

EXPORT rsmi_status_t rsmi_num_monitor_devices(uint32_t *num_devices) {
    if (!g_init) return RSMI_STATUS_INIT_ERROR;
    if (!num_devices) return RSMI_STATUS_INVALID_ARGS;
    struct dev devs[MAX_DEV];
    int n = load(devs);
    *num_devices = n < 0 ? 0u : (uint32_t)n;
    return RSMI_STATUS_SUCCESS;
}

EXPORT rsmi_status_t rsmi_dev_pci_id_get(uint32_t dv_ind, uint64_t *bdfid) {
    DEVICE_OR_FAIL("rsmi_dev_pci_id_get", dv_ind)
    if (!bdfid) return RSMI_STATUS_INVALID_ARGS;
    /* rocm_smi.h: BDFID = ((DOMAIN & 0xffffffff) << 32) | ((BUS & 0xff) << 8) | ((DEVICE & 0x1f) << 3) | (FUNCTION & 0x7) */
    *bdfid = ((d->domain & 0xffffffffull) << 32) | ((d->bus & 0xffull) << 8) | ((d->device & 0x1full) << 3) |
             (d->function & 0x7ull);
    return RSMI_STATUS_SUCCESS;
}

EXPORT rsmi_status_t rsmi_dev_serial_number_get(uint32_t dv_ind, char *serial_num, uint32_t len) {
    DEVICE_OR_FAIL("rsmi_dev_serial_number_get", dv_ind)
    if (!serial_num) return RSMI_STATUS_INVALID_ARGS;
    if (strlen(d->serial) + 1 > len) return RSMI_STATUS_INSUFFICIENT_SIZE;
    strcpy(serial_num, d->serial);
    return RSMI_STATUS_SUCCESS;
}

EXPORT rsmi_status_t rsmi_dev_id_get(uint32_t dv_ind, uint16_t *id) {
    DEVICE_OR_FAIL("rsmi_dev_id_get", dv_ind)
    if (!id) return RSMI_STATUS_INVALID_ARGS;
    *id = (uint16_t)d->id;
    return RSMI_STATUS_SUCCESS;
}

EXPORT rsmi_status_t rsmi_dev_memory_total_get(uint32_t dv_ind, rsmi_memory_type_t mem_type, uint64_t *total) {
    DEVICE_OR_FAIL("rsmi_dev_memory_total_get", dv_ind)
    if (!total || mem_type != RSMI_MEM_TYPE_VRAM) return RSMI_STATUS_INVALID_ARGS;
    *total = d->total;
    return RSMI_STATUS_SUCCESS;
}

EXPORT rsmi_status_t rsmi_dev_memory_usage_get(uint32_t dv_ind, rsmi_memory_type_t mem_type, uint64_t *used) {
    DEVICE_OR_FAIL("rsmi_dev_memory_usage_get", dv_ind)
    if (!used || mem_type != RSMI_MEM_TYPE_VRAM) return RSMI_STATUS_INVALID_ARGS;
    struct fake_reading r;
    if (fake_reading("FAKE_DTK_READINGS", (int)dv_ind, &r) < 0) return RSMI_STATUS_NOT_FOUND;
    *used = r.memory_used == FAKE_UNSUPPORTED ? d->used : (uint64_t)r.memory_used;
    return RSMI_STATUS_SUCCESS;
}

/* Figure `which` (0 busy, 1 power, 2 temperature) of device `dv_ind`'s readings, NOT_SUPPORTED where "-". */
static rsmi_status_t figure(uint32_t dv_ind, int which, long long *out) {
    struct fake_reading r;
    if (fake_reading("FAKE_DTK_READINGS", (int)dv_ind, &r) < 0) return RSMI_STATUS_NOT_FOUND;
    long long value = which == 0 ? r.busy : which == 1 ? r.power_mw : r.celsius;
    if (value == FAKE_UNSUPPORTED) return RSMI_STATUS_NOT_SUPPORTED;
    *out = value;
    return RSMI_STATUS_SUCCESS;
}

EXPORT rsmi_status_t rsmi_dev_busy_percent_get(uint32_t dv_ind, uint32_t *busy_percent) {
    DEVICE_OR_FAIL("rsmi_dev_busy_percent_get", dv_ind)
    (void)d;
    long long value;
    if (!busy_percent) return RSMI_STATUS_INVALID_ARGS;
    rsmi_status_t status = figure(dv_ind, 0, &value);
    if (status == RSMI_STATUS_SUCCESS) *busy_percent = (uint32_t)value;
    return status;
}

EXPORT rsmi_status_t rsmi_dev_power_ave_get(uint32_t dv_ind, uint32_t sensor_ind, uint64_t *power) {
    DEVICE_OR_FAIL("rsmi_dev_power_ave_get", dv_ind)
    (void)d;
    long long value;
    if (!power || sensor_ind != 0) return RSMI_STATUS_INVALID_ARGS;
    rsmi_status_t status = figure(dv_ind, 1, &value);
    if (status == RSMI_STATUS_SUCCESS) *power = (uint64_t)value * 1000; /* microwatts */
    return status;
}

typedef enum { RSMI_TEMP_TYPE_EDGE = 0 } rsmi_temperature_type_t;
typedef enum { RSMI_TEMP_CURRENT = 0 } rsmi_temperature_metric_t;

EXPORT rsmi_status_t rsmi_dev_temp_metric_get(uint32_t dv_ind, uint32_t sensor_type, rsmi_temperature_metric_t metric,
                                              int64_t *temperature) {
    DEVICE_OR_FAIL("rsmi_dev_temp_metric_get", dv_ind)
    (void)d;
    long long value;
    if (!temperature || sensor_type != RSMI_TEMP_TYPE_EDGE || metric != RSMI_TEMP_CURRENT) return RSMI_STATUS_INVALID_ARGS;
    rsmi_status_t status = figure(dv_ind, 2, &value);
    if (status == RSMI_STATUS_SUCCESS) *temperature = value * 1000; /* millidegrees Celsius */
    return status;
}

EXPORT rsmi_status_t rsmi_topo_numa_affinity_get(uint32_t dv_ind, int32_t *numa_node) {
    DEVICE_OR_FAIL("rsmi_topo_numa_affinity_get", dv_ind)
    if (!numa_node) return RSMI_STATUS_INVALID_ARGS;
    *numa_node = d->numa;
    return RSMI_STATUS_SUCCESS;
}

typedef struct {
    uint32_t process_id;
    uint32_t pasid;
    uint64_t vram_usage; /* bytes, over all the process's GPUs */
    uint64_t sdma_usage;
    uint32_t cu_occupancy;
} rsmi_process_info_t;

#define MAX_PROCS 256
struct proc_row {
    uint32_t pid;
    uint64_t bytes[MAX_DEV];
    int on[MAX_DEV];
};

/* The table's processes, one row per PID; -1 when the table cannot be read. */
static int proc_rows(struct proc_row *rows) {
    struct dev devs[MAX_DEV];
    int ndev = load(devs), count = 0;
    for (int dv = 0; dv < ndev; dv++) {
        struct fake_process found[MAX_PROCS];
        int n = fake_processes("FAKE_DTK_PROCESSES", dv, found, MAX_PROCS);
        if (n < 0 || n > MAX_PROCS) return -1;
        for (int i = 0; i < n; i++) {
            int r = 0;
            while (r < count && rows[r].pid != found[i].pid) r++;
            if (r == count) {
                if (count == MAX_PROCS) return -1;
                memset(&rows[count], 0, sizeof rows[count]);
                rows[count++].pid = found[i].pid;
            }
            rows[r].bytes[dv] += found[i].bytes;
            rows[r].on[dv] = 1;
        }
    }
    return count;
}

static void fill(rsmi_process_info_t *out, const struct proc_row *row, int only) {
    memset(out, 0, sizeof *out);
    out->process_id = row->pid;
    out->pasid = row->pid & 0xffff;
    for (int dv = 0; dv < MAX_DEV; dv++)
        if (only < 0 || dv == only) out->vram_usage += row->bytes[dv];
}

static struct proc_row g_rows[MAX_PROCS];

/* rocm_smi.h: procs NULL gives the number of processes in *num_items; too few items gives
 * RSMI_STATUS_INSUFFICIENT_SIZE after writing the first *num_items. */
EXPORT rsmi_status_t rsmi_compute_process_info_get(rsmi_process_info_t *procs, uint32_t *num_items) {
    if (!g_init) return RSMI_STATUS_INIT_ERROR;
    if (!num_items) return RSMI_STATUS_INVALID_ARGS;
    if (failing("rsmi_compute_process_info_get")) return RSMI_STATUS_NOT_SUPPORTED;
    int n = proc_rows(g_rows);
    if (n < 0) return RSMI_STATUS_NOT_SUPPORTED;
    if (procs) {
        for (int i = 0; i < n && (uint32_t)i < *num_items; i++) fill(&procs[i], &g_rows[i], -1);
        if (*num_items < (uint32_t)n) return RSMI_STATUS_INSUFFICIENT_SIZE;
    }
    *num_items = (uint32_t)n;
    return RSMI_STATUS_SUCCESS;
}

static const struct proc_row *row_of(uint32_t pid, int n) {
    for (int i = 0; i < n; i++)
        if (g_rows[i].pid == pid) return &g_rows[i];
    return NULL;
}

EXPORT rsmi_status_t rsmi_compute_process_gpus_get(uint32_t pid, uint32_t *dv_indices, uint32_t *num_devices) {
    if (!g_init) return RSMI_STATUS_INIT_ERROR;
    if (!num_devices) return RSMI_STATUS_INVALID_ARGS;
    int n = proc_rows(g_rows);
    const struct proc_row *row = n < 0 ? NULL : row_of(pid, n);
    if (!row) return RSMI_STATUS_NOT_FOUND;
    uint32_t found = 0;
    for (int dv = 0; dv < MAX_DEV; dv++) {
        if (!row->on[dv]) continue;
        if (dv_indices && found < *num_devices) dv_indices[found] = (uint32_t)dv;
        found++;
    }
    if (dv_indices && *num_devices < found) return RSMI_STATUS_INSUFFICIENT_SIZE;
    *num_devices = found;
    return RSMI_STATUS_SUCCESS;
}

EXPORT rsmi_status_t rsmi_compute_process_info_by_pid_get(uint32_t pid, rsmi_process_info_t *proc) {
    if (!g_init) return RSMI_STATUS_INIT_ERROR;
    if (!proc) return RSMI_STATUS_INVALID_ARGS;
    int n = proc_rows(g_rows);
    const struct proc_row *row = n < 0 ? NULL : row_of(pid, n);
    if (!row) return RSMI_STATUS_NOT_FOUND;
    fill(proc, row, -1);
    return RSMI_STATUS_SUCCESS;
}

#ifndef FAKE_RSMI_NO_BY_DEVICE
EXPORT rsmi_status_t rsmi_compute_process_info_by_device_get(uint32_t pid, uint32_t dv_ind, rsmi_process_info_t *proc) {
    DEVICE_OR_FAIL("rsmi_compute_process_info_by_device_get", dv_ind)
    (void)d;
    if (!proc) return RSMI_STATUS_INVALID_ARGS;
    int rows = proc_rows(g_rows);
    const struct proc_row *row = rows < 0 ? NULL : row_of(pid, rows);
    if (!row || !row->on[dv_ind]) return RSMI_STATUS_NOT_FOUND;
    fill(proc, row, (int)dv_ind);
    return RSMI_STATUS_SUCCESS;
}
#endif
#endif

#ifdef FAKE_DMI
typedef enum { DMI_STATUS_SUCCESS = 0, DMI_STATUS_ERROR = 1, DMI_STATUS_OPEN_MKFD_FAILED = 3,
               DMI_STATUS_NOT_SUPPORTED = 6, DMI_STATUS_CREATE_VDEV_FAILED = 8, DMI_STATUS_INVALID_ARGUMENTS = 10,
               DMI_STATUS_OUT_OF_RESOURCES = 11, DMI_STATUS_VDEV_NOT_EXIST = 15 } dmiStatus;
#define DMI_NAME_SIZE (256)
typedef struct {
    char name[DMI_NAME_SIZE];
    int compute_unit_count;
    size_t global_mem_size;
    size_t usage_mem_size;
    uint64_t container_id;
    int device_id;
} dmiDeviceInfo;

struct vdev { int id, device, cus, mem; };

static int load_vdevs(struct vdev *out) {
    const char *path = getenv("FAKE_DTK_STATE");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return 0;
    int n = 0;
    while (n < MAX_VDEV && fscanf(f, "%d %d %d %d", &out[n].id, &out[n].device, &out[n].cus, &out[n].mem) == 4) n++;
    fclose(f);
    return n;
}

static int save_vdevs(const struct vdev *v, int n) {
    const char *path = getenv("FAKE_DTK_STATE");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f) return -1;
    for (int i = 0; i < n; i++) fprintf(f, "%d %d %d %d\n", v[i].id, v[i].device, v[i].cus, v[i].mem);
    fclose(f);
    return 0;
}

#define DMI_OPEN(name)                                                                                     \
    struct dev devs[MAX_DEV];                                                                              \
    int n = load(devs);                                                                                    \
    if (n < 0) return DMI_STATUS_OPEN_MKFD_FAILED;                                                         \
    if (failing(name)) return DMI_STATUS_ERROR;

EXPORT dmiStatus dmiGetDeviceCount(int *count) {
    DMI_OPEN("dmiGetDeviceCount")
    if (!count) return DMI_STATUS_INVALID_ARGUMENTS;
    *count = n;
    return DMI_STATUS_SUCCESS;
}

EXPORT dmiStatus dmiGetDeviceInfo(int device_id, dmiDeviceInfo *info) {
    DMI_OPEN("dmiGetDeviceInfo")
    if (!info || device_id < 0 || device_id >= n) return DMI_STATUS_INVALID_ARGUMENTS;
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "DCU %04x", devs[device_id].id);
    info->compute_unit_count = devs[device_id].cus;
    info->global_mem_size = (size_t)devs[device_id].total;
    info->usage_mem_size = (size_t)devs[device_id].used;
    info->device_id = device_id;
    return DMI_STATUS_SUCCESS;
}

EXPORT dmiStatus dmiGetDeviceRemainingInfo(int device_id, size_t *cus, size_t *memories) {
    DMI_OPEN("dmiGetDeviceRemainingInfo")
    if (!cus || !memories || device_id < 0 || device_id >= n) return DMI_STATUS_INVALID_ARGUMENTS;
    struct vdev v[MAX_VDEV];
    int m = load_vdevs(v);
    long long c = devs[device_id].cus, mem = (long long)devs[device_id].total;
    for (int i = 0; i < m; i++)
        if (v[i].device == device_id) {
            c -= v[i].cus;
            mem -= (long long)v[i].mem * 1024 * 1024;
        }
    *cus = c < 0 ? 0 : (size_t)c;
    *memories = mem < 0 ? 0 : (size_t)mem;
    return DMI_STATUS_SUCCESS;
}

EXPORT dmiStatus dmiGetVDeviceCount(int *count) {
    DMI_OPEN("dmiGetVDeviceCount")
    if (!count) return DMI_STATUS_INVALID_ARGUMENTS;
    struct vdev v[MAX_VDEV];
    *count = load_vdevs(v);
    return DMI_STATUS_SUCCESS;
}

EXPORT dmiStatus dmiGetVDeviceInfo(int vdevice_id, dmiDeviceInfo *info) {
    DMI_OPEN("dmiGetVDeviceInfo")
    if (!info) return DMI_STATUS_INVALID_ARGUMENTS;
    struct vdev v[MAX_VDEV];
    int m = load_vdevs(v);
    for (int i = 0; i < m; i++)
        if (v[i].id == vdevice_id) {
            memset(info, 0, sizeof *info);
            snprintf(info->name, sizeof info->name, "vDCU %d", v[i].id);
            info->compute_unit_count = v[i].cus;
            info->global_mem_size = (size_t)v[i].mem * 1024 * 1024;
            info->device_id = v[i].device;
            return DMI_STATUS_SUCCESS;
        }
    return DMI_STATUS_VDEV_NOT_EXIST;
}

EXPORT dmiStatus dmiCreateVDevices(int device_id, int vdev_count, int *vdev_cus, int *vdev_mem_size) {
    DMI_OPEN("dmiCreateVDevices")
    if (device_id < 0 || device_id >= n || vdev_count < 1 || !vdev_cus || !vdev_mem_size)
        return DMI_STATUS_INVALID_ARGUMENTS;
    struct vdev v[MAX_VDEV];
    int m = load_vdevs(v);
    long long c = devs[device_id].cus, mem = (long long)(devs[device_id].total / (1024 * 1024));
    for (int i = 0; i < m; i++)
        if (v[i].device == device_id) {
            c -= v[i].cus;
            mem -= v[i].mem;
        }
    for (int k = 0; k < vdev_count; k++) {
        if (vdev_cus[k] < 1 || vdev_mem_size[k] < 1) return DMI_STATUS_INVALID_ARGUMENTS;
        c -= vdev_cus[k];
        mem -= vdev_mem_size[k];
    }
    if (c < 0 || mem < 0 || m + vdev_count > MAX_VDEV) return DMI_STATUS_OUT_OF_RESOURCES;
    for (int k = 0; k < vdev_count; k++) {
        int id = 0; /* the lowest free id */
        for (int again = 1; again;) {
            again = 0;
            for (int i = 0; i < m; i++)
                if (v[i].id == id) {
                    id++;
                    again = 1;
                }
        }
        v[m++] = (struct vdev){id, device_id, vdev_cus[k], vdev_mem_size[k]};
    }
    return save_vdevs(v, m) == 0 ? DMI_STATUS_SUCCESS : DMI_STATUS_CREATE_VDEV_FAILED;
}

EXPORT dmiStatus dmiDestroySingleVDevice(int vdevice_id) {
    DMI_OPEN("dmiDestroySingleVDevice")
    struct vdev v[MAX_VDEV];
    int m = load_vdevs(v), kept = 0, found = 0;
    for (int i = 0; i < m; i++) {
        if (v[i].id == vdevice_id) found = 1;
        else v[kept++] = v[i];
    }
    if (!found) return DMI_STATUS_VDEV_NOT_EXIST;
    return save_vdevs(v, kept) == 0 ? DMI_STATUS_SUCCESS : DMI_STATUS_ERROR;
}
#endif
