/*
 * fake_dcmi.c: a fake DCMI (libdcmi.so) built by the discovery tests from DCMI's documented interface
 * (dcmi_interface_api.h): the calls, argument orders and structure layouts the real driver library has, answering
 * from a machine description instead of hardware.
 *
 * The machine is the file named by FAKE_DCMI_CONFIG, read again at every dcmi_get_card_list call (so a test can
 * change a chip's health between two discovery rounds), one NPU per line:
 *
 *     card device logic phy chip_name aicore health memory_mb die0 die1 die2 die3 die4 hbm|ddr
 *
 * (blank lines and lines starting with # are ignored; the die words are hex). `hbm` chips answer
 * dcmi_get_device_hbm_info, `ddr` chips (310P) answer it with zeros and give their memory through
 * dcmi_get_device_memory_info_v3, as the real driver does.
 *
 * FAKE_DCMI_INIT_FAIL=1 makes dcmi_init fail (no driver loaded); FAKE_DCMI_FAIL=<function> makes that function
 * fail. Built with -DOLD_DRIVER it has the older names only: dcmi_get_card_num_list instead of
 * dcmi_get_card_list, dcmi_get_device_die instead of dcmi_get_device_die_v2.
 *
 * dcmi_get_device_resource_info (the processes on a chip, host PIDs, memory in bytes, at most 32 as DCMI documents)
 * answers from the process table FAKE_DCMI_PROCESSES names (core's fake_processes.h; the device index is the NPU's
 * line in the machine file). The readings (dcmi_get_device_hbm_info's memory_usage, or for `ddr` chips
 * dcmi_get_device_memory_info_v3's size less available, MB; dcmi_get_device_utilization_rate of the AI cores (input
 * type 2), percent; dcmi_get_device_power_info, 0.1 W; dcmi_get_device_temperature, degrees) answer from the file
 * FAKE_DCMI_READINGS names (core's fake_readings.h, the device index being the NPU's line; "-":
 * DCMI_ERR_CODE_NOT_SUPPORT, or the chip's own figure for the memory).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_processes.h"
#include "fake_readings.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_NPUS 64

struct dcmi_chip_info {
    unsigned char chip_type[32];
    unsigned char chip_name[32];
    unsigned char chip_ver[32];
    unsigned int aicore_cnt;
};

struct dcmi_hbm_info {
    unsigned long long memory_size;
    unsigned int freq;
    unsigned long long memory_usage;
    int temp;
    unsigned int bandwith_util_rate;
};

struct dcmi_get_memory_info_stru {
    unsigned long long memory_size;
    unsigned long long memory_available;
    unsigned int freq;
    unsigned long hugepagesize;
    unsigned long hugepages_total;
    unsigned long hugepages_free;
    unsigned int utiliza;
    unsigned char reserve[60];
};

struct dcmi_die_id {
    unsigned int soc_die[5];
};

struct npu {
    int card, device, logic, phy;
    char name[32];
    unsigned aicore, health;
    unsigned long long memory;
    unsigned die[5];
    int hbm;
};

static struct npu g_npus[MAX_NPUS];
static int g_count;
static int g_initialized;

enum { OK = 0, ERR_INVALID = -8001, ERR_NOT_INIT = -8005, ERR_NOT_FOUND = -8013 };

static int failing(const char *call) {
    const char *f = getenv("FAKE_DCMI_FAIL");
    return f && !strcmp(f, call);
}

static void load(void) {
    g_count = 0;
    const char *path = getenv("FAKE_DCMI_CONFIG");
    FILE *file = path ? fopen(path, "r") : NULL;
    if (!file) return;
    char line[512];
    while (g_count < MAX_NPUS && fgets(line, sizeof line, file)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        struct npu *n = &g_npus[g_count];
        char kind[8] = "hbm";
        int got = sscanf(line, "%d %d %d %d %31s %u %u %llu %x %x %x %x %x %7s", &n->card, &n->device, &n->logic,
                         &n->phy, n->name, &n->aicore, &n->health, &n->memory, &n->die[0], &n->die[1], &n->die[2],
                         &n->die[3], &n->die[4], kind);
        if (got < 13) continue;
        n->hbm = strcmp(kind, "ddr") != 0;
        g_count++;
    }
    fclose(file);
}

static struct npu *find(int card, int device) {
    for (int i = 0; i < g_count; i++)
        if (g_npus[i].card == card && g_npus[i].device == device) return &g_npus[i];
    return NULL;
}

#define CHECK(call)                                                                                            \
    do {                                                                                                       \
        if (!g_initialized) return ERR_NOT_INIT;                                                               \
        if (failing(call)) return ERR_INVALID;                                                                 \
    } while (0)

EXPORT int dcmi_init(void) {
    if (getenv("FAKE_DCMI_INIT_FAIL")) return ERR_NOT_INIT;
    load();
    g_initialized = 1;
    return OK;
}

static int list_cards(int *card_num, int *card_list, int list_len) {
    if (!card_num || !card_list) return ERR_INVALID;
    load();
    int n = 0;
    for (int i = 0; i < g_count; i++) {
        int seen = 0;
        for (int j = 0; j < n; j++) seen |= card_list[j] == g_npus[i].card;
        if (!seen && n < list_len) card_list[n++] = g_npus[i].card;
    }
    *card_num = n;
    return OK;
}

#ifdef OLD_DRIVER
EXPORT int dcmi_get_card_num_list(int *card_num, int *card_list, int list_len) {
    CHECK("dcmi_get_card_num_list");
    return list_cards(card_num, card_list, list_len);
}
#else
EXPORT int dcmi_get_card_list(int *card_num, int *card_list, int list_len) {
    CHECK("dcmi_get_card_list");
    return list_cards(card_num, card_list, list_len);
}
#endif

EXPORT int dcmi_get_device_num_in_card(int card_id, int *device_num) {
    CHECK("dcmi_get_device_num_in_card");
    if (!device_num) return ERR_INVALID;
    int n = 0;
    for (int i = 0; i < g_count; i++) n += g_npus[i].card == card_id;
    if (!n) return ERR_NOT_FOUND;
    *device_num = n;
    return OK;
}

EXPORT int dcmi_get_device_logic_id(int *device_logic_id, int card_id, int device_id) {
    CHECK("dcmi_get_device_logic_id");
    struct npu *n = find(card_id, device_id);
    if (!n || !device_logic_id) return ERR_INVALID;
    *device_logic_id = n->logic;
    return OK;
}

EXPORT int dcmi_get_device_phyid_from_logicid(unsigned int logicid, unsigned int *phyid) {
    CHECK("dcmi_get_device_phyid_from_logicid");
    for (int i = 0; i < g_count; i++)
        if ((unsigned)g_npus[i].logic == logicid && phyid) {
            *phyid = (unsigned)g_npus[i].phy;
            return OK;
        }
    return ERR_INVALID;
}

EXPORT int dcmi_get_device_chip_info(int card_id, int device_id, struct dcmi_chip_info *chip_info) {
    CHECK("dcmi_get_device_chip_info");
    struct npu *n = find(card_id, device_id);
    if (!n || !chip_info) return ERR_INVALID;
    memset(chip_info, 0, sizeof *chip_info);
    snprintf((char *)chip_info->chip_type, sizeof chip_info->chip_type, "Ascend");
    snprintf((char *)chip_info->chip_name, sizeof chip_info->chip_name, "%s", n->name);
    snprintf((char *)chip_info->chip_ver, sizeof chip_info->chip_ver, "V1");
    chip_info->aicore_cnt = n->aicore;
    return OK;
}

EXPORT int dcmi_get_device_health(int card_id, int device_id, unsigned int *health) {
    CHECK("dcmi_get_device_health");
    struct npu *n = find(card_id, device_id);
    if (!n || !health) return ERR_INVALID;
    *health = n->health;
    return OK;
}

static int die(int card_id, int device_id, struct dcmi_die_id *die_id) {
    struct npu *n = find(card_id, device_id);
    if (!n || !die_id) return ERR_INVALID;
    memcpy(die_id->soc_die, n->die, sizeof n->die);
    return OK;
}

#ifdef OLD_DRIVER
EXPORT int dcmi_get_device_die(int card_id, int device_id, struct dcmi_die_id *die_id) {
    CHECK("dcmi_get_device_die");
    return die(card_id, device_id, die_id);
}
#else
EXPORT int dcmi_get_device_die_v2(int card_id, int device_id, int input_type, struct dcmi_die_id *die_id) {
    CHECK("dcmi_get_device_die_v2");
    if (input_type != 1) return ERR_INVALID; /* only VDIE is what the tests expect to be asked */
    return die(card_id, device_id, die_id);
}
#endif

EXPORT int dcmi_get_device_hbm_info(int card_id, int device_id, struct dcmi_hbm_info *hbm_info) {
    CHECK("dcmi_get_device_hbm_info");
    struct npu *n = find(card_id, device_id);
    if (!n || !hbm_info) return ERR_INVALID;
    struct fake_reading r;
    if (fake_reading("FAKE_DCMI_READINGS", (int)(n - g_npus), &r) < 0) return ERR_INVALID;
    memset(hbm_info, 0, sizeof *hbm_info);
    if (n->hbm) {
        hbm_info->memory_size = n->memory;
        hbm_info->memory_usage = r.memory_used == FAKE_UNSUPPORTED ? n->memory / 16 : (unsigned long long)r.memory_used >> 20;
    }
    return OK;
}

EXPORT int dcmi_get_device_memory_info_v3(int card_id, int device_id, struct dcmi_get_memory_info_stru *memory) {
    CHECK("dcmi_get_device_memory_info_v3");
    struct npu *n = find(card_id, device_id);
    if (!n || !memory) return ERR_INVALID;
    memset(memory, 0, sizeof *memory);
    memory->memory_size = n->hbm ? 16384 : n->memory; /* an HBM chip's DDR is not its device memory */
    memory->memory_available = memory->memory_size / 2;
    struct fake_reading r;
    if (!n->hbm && fake_reading("FAKE_DCMI_READINGS", (int)(n - g_npus), &r) > 0 && r.memory_used != FAKE_UNSUPPORTED)
        memory->memory_available = memory->memory_size - (unsigned long long)(r.memory_used >> 20);
    return OK;
}

#define DCMI_ERR_CODE_NOT_SUPPORT (-8255)

/* Figure `which` (0 busy, 1 power, 2 temperature) of the chip at card/device, DCMI_ERR_CODE_NOT_SUPPORT where "-". */
static int figure(int card_id, int device_id, int which, long long *out) {
    struct npu *n = find(card_id, device_id);
    struct fake_reading r;
    if (!n || !out) return ERR_INVALID;
    if (fake_reading("FAKE_DCMI_READINGS", (int)(n - g_npus), &r) < 0) return ERR_INVALID;
    *out = which == 0 ? r.busy : which == 1 ? r.power_mw : r.celsius;
    return *out == FAKE_UNSUPPORTED ? DCMI_ERR_CODE_NOT_SUPPORT : OK;
}

EXPORT int dcmi_get_device_utilization_rate(int card_id, int device_id, int input_type, unsigned int *utilization_rate) {
    CHECK("dcmi_get_device_utilization_rate");
    long long busy;
    if (!utilization_rate) return ERR_INVALID;
    if (input_type != 2) return DCMI_ERR_CODE_NOT_SUPPORT; /* the fake knows the AI cores' share only */
    int code = figure(card_id, device_id, 0, &busy);
    if (code == OK) *utilization_rate = (unsigned)busy;
    return code;
}

EXPORT int dcmi_get_device_power_info(int card_id, int device_id, int *power) {
    CHECK("dcmi_get_device_power_info");
    long long milliwatts;
    if (!power) return ERR_INVALID;
    int code = figure(card_id, device_id, 1, &milliwatts);
    if (code == OK) *power = (int)(milliwatts / 100); /* 0.1 W */
    return code;
}

EXPORT int dcmi_get_device_temperature(int card_id, int device_id, int *temperature) {
    CHECK("dcmi_get_device_temperature");
    long long celsius;
    if (!temperature) return ERR_INVALID;
    int code = figure(card_id, device_id, 2, &celsius);
    if (code == OK) *temperature = (int)celsius;
    return code;
}

struct dcmi_proc_mem_info {
    int proc_id;
    unsigned long proc_mem_usage; /* bytes: the device OS's share for the process and what it allocated */
};

#define DCMI_MAX_PROC_NUM 32

EXPORT int dcmi_get_device_resource_info(int card_id, int device_id, struct dcmi_proc_mem_info *proc_info,
                                         int *proc_num) {
    CHECK("dcmi_get_device_resource_info");
    struct npu *n = find(card_id, device_id);
    if (!n || !proc_info || !proc_num) return ERR_INVALID;
    struct fake_process found[DCMI_MAX_PROC_NUM];
    int count = fake_processes("FAKE_DCMI_PROCESSES", (int)(n - g_npus), found, DCMI_MAX_PROC_NUM);
    if (count < 0) return ERR_INVALID;
    if (count > DCMI_MAX_PROC_NUM) count = DCMI_MAX_PROC_NUM;
    for (int i = 0; i < count; i++) {
        proc_info[i].proc_id = (int)found[i].pid;
        proc_info[i].proc_mem_usage = (unsigned long)found[i].bytes;
    }
    *proc_num = count;
    return OK;
}
