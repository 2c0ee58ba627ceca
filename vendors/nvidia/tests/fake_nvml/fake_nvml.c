/*
 * A fake NVML (libnvidia-ml.so.1) for the NVIDIA vendor's tests.
 *
 * It exports the NVML entry points pynvml calls for discovery (devices, memory, PCI, MIG mode and profiles
 * with their legal placements, NVLink states and remote ends, P2P topology levels, XID events) and for
 * MIG realization (GPU and compute instances created at a placement, listed, and destroyed). The machine
 * it pretends to be is read from a small JSON file named by FAKE_NVML_CONFIG when nvmlInit is called:
 *
 *   {"init_error": 0,                                  optional NVML return code of nvmlInit
 *    "driver": "550.54.15",
 *    "topology": [[0, 10], [10, 0]],                   optional NxN nvmlGpuTopologyLevel_t (default 40, NODE)
 *    "devices": [{
 *        "uuid": "GPU-...", "name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "bus_id": "00000000:07:00.0",
 *        "mig_mode": 1, "lost": false, "xids": [79],    XIDs delivered once after events are registered
 *        "nvlinks": [{"remote": "00000000:0F:00.0"}, {"remote": "switch"}, {"state": 0}],
 *        "mig_profiles": [{"id": 0, "name": "MIG 1g.5gb", "slices": 1, "instances": 7, "sms": 14,
 *                          "memory_mib": 4864, "placements": [[0, 1], [1, 1]]}],
 *        "instances": [{"profile": 0, "start": 6}],     GPU instances that exist already (with one CI)
 *        "processes": [{"pid": 4242, "gpu_instance": 1}] processes holding an instance (destroy -> IN_USE)
 *        "memory_used_mib": 0, "utilization": 37,       readings (utilization, power_mw, temperature absent or
 *        "power_mw": 250000, "temperature": 61          -1: NVML_ERROR_NOT_SUPPORTED)
 *    }]}
 *
 * State (created instances) survives nvmlShutdown/nvmlInit, as it does in a real driver; it is reset when
 * FAKE_NVML_CONFIG names another file or the file changed. Every hardware mutation is appended as one
 * JSON line to the file named by FAKE_NVML_LOG (when set), so tests can assert what was asked of the GPU.
 * Lines "<device index> <xid>" appended to the file named by FAKE_NVML_EVENTS become XID events.
 *
 * Not thread-safe beyond what the single-threaded tests need.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fake_processes.h"

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define EVENT_XID_CRITICAL 8ULL
#define NO_INSTANCE 0xFFFFFFFFu

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned start, size; } nvmlPlacement_t;
typedef struct {
    unsigned version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;
typedef struct {
    unsigned version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[96];
} nvmlComputeInstanceProfileInfo_v2_t;
typedef struct { void *device; unsigned id, profileId; nvmlPlacement_t placement; } nvmlGpuInstanceInfo_t;
typedef struct { void *device, *gpuInstance; unsigned id, profileId; nvmlPlacement_t placement; } nvmlComputeInstanceInfo_t;
typedef struct {
    void *device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

#define GI_PROFILE_INFO_V2 ((unsigned)(sizeof(nvmlGpuInstanceProfileInfo_v2_t) | (2u << 24)))
#define CI_PROFILE_INFO_V2 ((unsigned)(sizeof(nvmlComputeInstanceProfileInfo_v2_t) | (2u << 24)))

/* ----------------------------------------------------------------------------------------------------- */
/* A small JSON reader                                                                                   */
/* ----------------------------------------------------------------------------------------------------- */

enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
typedef struct jv {
    int type;
    double num;
    char *str;
    int len;
    struct jv *items;
    char **keys;
} jv;

static const char *jp;
static int jerr;

static void jskip(void) {
    while (*jp && isspace((unsigned char)*jp)) jp++;
}

static int jparse(jv *out);

static char *jstring(void) {
    size_t cap = 16, n = 0;
    char *s = malloc(cap);
    jp++; /* opening quote */
    while (*jp && *jp != '"') {
        char c = *jp++;
        if (c == '\\') {
            char e = *jp++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'u': c = '?'; jp += 4; break;
            default: c = e;
            }
        }
        if (n + 2 > cap) s = realloc(s, cap *= 2);
        s[n++] = c;
    }
    if (*jp != '"') jerr = 1; else jp++;
    s[n] = 0;
    return s;
}

static int jparse(jv *out) {
    memset(out, 0, sizeof(*out));
    jskip();
    if (*jp == '{' || *jp == '[') {
        int obj = *jp == '{';
        out->type = obj ? J_OBJ : J_ARR;
        jp++;
        int cap = 4;
        out->items = calloc(cap, sizeof(jv));
        if (obj) out->keys = calloc(cap, sizeof(char *));
        jskip();
        if (*jp == (obj ? '}' : ']')) { jp++; return 0; }
        for (;;) {
            if (out->len == cap) {
                cap *= 2;
                out->items = realloc(out->items, cap * sizeof(jv));
                if (obj) out->keys = realloc(out->keys, cap * sizeof(char *));
            }
            if (obj) {
                jskip();
                if (*jp != '"') return jerr = 1;
                out->keys[out->len] = jstring();
                jskip();
                if (*jp++ != ':') return jerr = 1;
            }
            if (jparse(&out->items[out->len])) return 1;
            out->len++;
            jskip();
            if (*jp == ',') { jp++; continue; }
            if (*jp == (obj ? '}' : ']')) { jp++; return 0; }
            return jerr = 1;
        }
    }
    if (*jp == '"') { out->type = J_STR; out->str = jstring(); return jerr; }
    if (!strncmp(jp, "true", 4)) { out->type = J_BOOL; out->num = 1; jp += 4; return 0; }
    if (!strncmp(jp, "false", 5)) { out->type = J_BOOL; jp += 5; return 0; }
    if (!strncmp(jp, "null", 4)) { out->type = J_NULL; jp += 4; return 0; }
    char *end;
    out->num = strtod(jp, &end);
    if (end == jp) return jerr = 1;
    out->type = J_NUM;
    jp = end;
    return 0;
}

static void jfree(jv *v) {
    for (int i = 0; i < v->len; i++) {
        jfree(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
}

static jv *jget(jv *obj, const char *key) {
    if (!obj || obj->type != J_OBJ) return NULL;
    for (int i = 0; i < obj->len; i++)
        if (!strcmp(obj->keys[i], key)) return &obj->items[i];
    return NULL;
}

static long long jint(jv *obj, const char *key, long long dflt) {
    jv *v = jget(obj, key);
    return v && (v->type == J_NUM || v->type == J_BOOL) ? (long long)v->num : dflt;
}

static const char *jstr(jv *obj, const char *key, const char *dflt) {
    jv *v = jget(obj, key);
    return v && v->type == J_STR ? v->str : dflt;
}

/* ----------------------------------------------------------------------------------------------------- */
/* The machine                                                                                           */
/* ----------------------------------------------------------------------------------------------------- */

enum { TAG_GPU = 0x47505521, TAG_GI = 0x47492121, TAG_CI = 0x43492121, TAG_SET = 0x53455421 };

#define MAX_GPUS 16
#define MAX_PROFILES 20
#define MAX_PLACEMENTS 8
#define MAX_LINKS 36
#define MAX_INSTANCES 64
#define MAX_XIDS 8
#define MAX_PROCS 8

struct gpu;
struct gi;

typedef struct {
    unsigned id, slices, instances, sms;
    unsigned long long memory_mib;
    char name[96];
    int nplacements;
    nvmlPlacement_t placements[MAX_PLACEMENTS];
} profile_t;

typedef struct ci {
    unsigned tag;
    struct gi *gi;
    unsigned id, profile_id;
    int alive;
    char uuid[96];
} ci_t;

typedef struct gi {
    unsigned tag;
    struct gpu *gpu;
    unsigned id, profile_id;
    nvmlPlacement_t placement;
    int alive;
    ci_t ci;
} gi_t;

typedef struct gpu {
    unsigned tag;
    int index;
    char uuid[96], name[96], bus[32];
    unsigned long long memory_mib;
    int mig_mode, lost;
    int nprofiles;
    profile_t profiles[MAX_PROFILES];
    int nlinks, has_links;
    int link_state[MAX_LINKS];
    char link_remote[MAX_LINKS][32]; /* a bus id, or "switch" */
    int nxids;
    unsigned xids[MAX_XIDS];
    int xids_delivered;
    int nprocs;
    unsigned proc_gi[MAX_PROCS];
    long long memory_used_mib, utilization, power_mw, temperature; /* -1: not supported */
    gi_t gis[MAX_INSTANCES];
    unsigned next_gi_id;
} gpu_t;

typedef struct {
    unsigned tag;
    int registered[MAX_GPUS];
    long events_offset;
} event_set_t;

static struct {
    int loaded, refs, init_error;
    char path[4096];
    struct timespec mtime;
    char driver[80];
    int cuda; /* the CUDA driver API version, e.g. 12040 ("cuda" in the JSON) */
    int ngpus;
    gpu_t gpus[MAX_GPUS];
    int topology[MAX_GPUS][MAX_GPUS];
} M;

static void logline(const char *fmt, ...) {
    const char *path = getenv("FAKE_NVML_LOG");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

static unsigned fnv(const char *s) {
    unsigned h = 2166136261u;
    while (*s) h = (h ^ (unsigned char)*s++) * 16777619u;
    return h;
}

static void mig_uuid(gi_t *g, char *out) {
    snprintf(out, 96, "MIG-%08x-%04x-%04x-%04x-%012x", fnv(g->gpu->uuid), g->id & 0xffff, g->ci.id & 0xffff,
             g->placement.start, g->placement.size * 0x1111u);
}

static profile_t *find_profile(gpu_t *g, unsigned id) {
    for (int i = 0; i < g->nprofiles; i++)
        if (g->profiles[i].id == id) return &g->profiles[i];
    return NULL;
}

static int overlaps(nvmlPlacement_t a, nvmlPlacement_t b) {
    return a.start < b.start + b.size && b.start < a.start + a.size;
}

static nvmlReturn_t create_gi(gpu_t *g, unsigned profile_id, nvmlPlacement_t want, gi_t **out) {
    profile_t *p = find_profile(g, profile_id);
    if (!g->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    int legal = 0;
    for (int i = 0; i < p->nplacements; i++)
        if (p->placements[i].start == want.start && p->placements[i].size == want.size) legal = 1;
    if (!legal) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned same = 0;
    gi_t *slot = NULL;
    for (int i = 0; i < MAX_INSTANCES; i++) {
        gi_t *o = &g->gis[i];
        if (!o->alive) {
            if (!slot && o->tag != TAG_GI) slot = o;
            continue;
        }
        if (overlaps(o->placement, want)) return NVML_ERROR_INSUFFICIENT_RESOURCES;
        if (o->profile_id == profile_id) same++;
    }
    if (same >= p->instances || !slot) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    memset(slot, 0, sizeof(*slot));
    slot->tag = TAG_GI;
    slot->gpu = g;
    slot->id = g->next_gi_id++;
    slot->profile_id = profile_id;
    slot->placement = want;
    slot->alive = 1;
    *out = slot;
    return NVML_SUCCESS;
}

static void create_ci(gi_t *gi, unsigned ci_profile) {
    memset(&gi->ci, 0, sizeof(gi->ci));
    gi->ci.tag = TAG_CI;
    gi->ci.gi = gi;
    gi->ci.id = 0;
    gi->ci.profile_id = ci_profile;
    gi->ci.alive = 1;
    mig_uuid(gi, gi->ci.uuid);
}

static unsigned ci_profile_for_slices(unsigned slices) {
    switch (slices) {
    case 1: return 0;
    case 2: return 1;
    case 3: return 2;
    case 4: return 3;
    case 7: return 4;
    case 8: return 5;
    case 6: return 6;
    default: return 0;
    }
}

static int load(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NVML_ERROR_UNKNOWN;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc(n + 1);
    if (fread(text, 1, n, f) != (size_t)n) { fclose(f); free(text); return NVML_ERROR_UNKNOWN; }
    text[n] = 0;
    fclose(f);
    jv root;
    jp = text;
    jerr = 0;
    if (jparse(&root) || jerr || root.type != J_OBJ) {
        fprintf(stderr, "fake NVML: %s is not a JSON object\n", path);
        free(text);
        return NVML_ERROR_UNKNOWN;
    }
    memset(&M.gpus, 0, sizeof(M.gpus));
    M.init_error = (int)jint(&root, "init_error", 0);
    snprintf(M.driver, sizeof(M.driver), "%s", jstr(&root, "driver", "550.54.15"));
    M.cuda = (int)jint(&root, "cuda", 12040);
    jv *devs = jget(&root, "devices");
    M.ngpus = devs && devs->type == J_ARR ? (devs->len > MAX_GPUS ? MAX_GPUS : devs->len) : 0;
    for (int i = 0; i < MAX_GPUS; i++)
        for (int j = 0; j < MAX_GPUS; j++) M.topology[i][j] = i == j ? 0 : 40;
    jv *topo = jget(&root, "topology");
    for (int i = 0; topo && topo->type == J_ARR && i < topo->len && i < MAX_GPUS; i++)
        for (int j = 0; topo->items[i].type == J_ARR && j < topo->items[i].len && j < MAX_GPUS; j++)
            M.topology[i][j] = (int)topo->items[i].items[j].num;
    for (int i = 0; i < M.ngpus; i++) {
        jv *d = &devs->items[i];
        gpu_t *g = &M.gpus[i];
        g->tag = TAG_GPU;
        g->index = i;
        g->next_gi_id = 1;
        snprintf(g->uuid, sizeof(g->uuid), "%s", jstr(d, "uuid", "GPU-00000000-0000-0000-0000-000000000000"));
        snprintf(g->name, sizeof(g->name), "%s", jstr(d, "name", "NVIDIA Fake GPU"));
        snprintf(g->bus, sizeof(g->bus), "%s", jstr(d, "bus_id", "00000000:00:00.0"));
        g->memory_mib = (unsigned long long)jint(d, "memory_mib", 16384);
        g->mig_mode = (int)jint(d, "mig_mode", 0);
        g->lost = (int)jint(d, "lost", 0);
        g->memory_used_mib = jint(d, "memory_used_mib", 0);
        g->utilization = jint(d, "utilization", -1);
        g->power_mw = jint(d, "power_mw", -1);
        g->temperature = jint(d, "temperature", -1);
        jv *profiles = jget(d, "mig_profiles");
        for (int k = 0; profiles && profiles->type == J_ARR && k < profiles->len && k < MAX_PROFILES; k++) {
            jv *p = &profiles->items[k];
            profile_t *t = &g->profiles[g->nprofiles++];
            t->id = (unsigned)jint(p, "id", k);
            t->slices = (unsigned)jint(p, "slices", 1);
            t->instances = (unsigned)jint(p, "instances", 1);
            t->sms = (unsigned)jint(p, "sms", 14);
            t->memory_mib = (unsigned long long)jint(p, "memory_mib", 4864);
            snprintf(t->name, sizeof(t->name), "%s", jstr(p, "name", "MIG 1g.5gb"));
            jv *pl = jget(p, "placements");
            for (int m = 0; pl && pl->type == J_ARR && m < pl->len && m < MAX_PLACEMENTS; m++) {
                jv *pair = &pl->items[m];
                if (pair->type != J_ARR || pair->len != 2) continue;
                t->placements[t->nplacements].start = (unsigned)pair->items[0].num;
                t->placements[t->nplacements].size = (unsigned)pair->items[1].num;
                t->nplacements++;
            }
        }
        jv *links = jget(d, "nvlinks");
        if (links && links->type == J_ARR) {
            g->has_links = 1;
            for (int k = 0; k < links->len && k < MAX_LINKS; k++) {
                jv *l = &links->items[k];
                g->link_state[k] = (int)jint(l, "state", 1);
                snprintf(g->link_remote[k], 32, "%s", jstr(l, "remote", ""));
                g->nlinks++;
            }
        }
        jv *xids = jget(d, "xids");
        for (int k = 0; xids && xids->type == J_ARR && k < xids->len && k < MAX_XIDS; k++)
            g->xids[g->nxids++] = (unsigned)xids->items[k].num;
        jv *insts = jget(d, "instances");
        for (int k = 0; insts && insts->type == J_ARR && k < insts->len; k++) {
            jv *in = &insts->items[k];
            profile_t *p = find_profile(g, (unsigned)jint(in, "profile", 0));
            if (!p) continue;
            nvmlPlacement_t want = {(unsigned)jint(in, "start", 0), p->nplacements ? p->placements[0].size : 1};
            for (int m = 0; m < p->nplacements; m++)
                if (p->placements[m].start == want.start) want.size = p->placements[m].size;
            gi_t *made;
            if (create_gi(g, p->id, want, &made) == NVML_SUCCESS) create_ci(made, ci_profile_for_slices(p->slices));
        }
        jv *procs = jget(d, "processes");
        for (int k = 0; procs && procs->type == J_ARR && k < procs->len && k < MAX_PROCS; k++)
            g->proc_gi[g->nprocs++] = (unsigned)jint(&procs->items[k], "gpu_instance", NO_INSTANCE);
    }
    jfree(&root);
    free(text);
    return NVML_SUCCESS;
}

#define NEED_INIT() do { if (M.refs <= 0) return NVML_ERROR_UNINITIALIZED; } while (0)

static gpu_t *as_gpu(void *h) {
    gpu_t *g = h;
    return g && g->tag == TAG_GPU ? g : NULL;
}

static ci_t *as_mig(void *h) {
    ci_t *c = h;
    return c && c->tag == TAG_CI && c->alive ? c : NULL;
}

static gi_t *as_gi(void *h) {
    gi_t *g = h;
    return g && g->tag == TAG_GI && g->alive ? g : NULL;
}

static nvmlReturn_t copy_str(char *dst, unsigned size, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > size) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

static void fill_pci(nvmlPciInfo_t *pci, const char *bus) {
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busId, sizeof(pci->busId), "%s", bus);
    /* the legacy field holds the short form: "0000:" domain + bus:device.function */
    const char *tail = strlen(bus) > 8 ? bus + 4 : bus;
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%s", tail);
    unsigned dom = 0, b = 0, dev = 0;
    sscanf(bus, "%x:%x:%x", &dom, &b, &dev);
    pci->domain = dom;
    pci->bus = b;
    pci->device = dev;
    pci->pciDeviceId = 0x20b010de;
}

/* ----------------------------------------------------------------------------------------------------- */
/* Initialization                                                                                        */
/* ----------------------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    const char *path = getenv("FAKE_NVML_CONFIG");
    if (!path || !*path) return NVML_ERROR_UNKNOWN;
    struct stat st;
    if (stat(path, &st) != 0) return NVML_ERROR_UNKNOWN;
    if (!M.loaded || strcmp(path, M.path) != 0 || st.st_mtim.tv_sec != M.mtime.tv_sec ||
        st.st_mtim.tv_nsec != M.mtime.tv_nsec) {
        nvmlReturn_t r = load(path);
        if (r != NVML_SUCCESS) return r;
        M.loaded = 1;
        M.refs = 0;
        snprintf(M.path, sizeof(M.path), "%s", path);
        M.mtime = st.st_mtim;
    }
    if (M.init_error) return M.init_error;
    M.refs++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    NEED_INIT();
    M.refs--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    NEED_INIT();
    return copy_str(version, length, M.driver);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    NEED_INIT();
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = M.cuda;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

/* ----------------------------------------------------------------------------------------------------- */
/* Devices                                                                                               */
/* ----------------------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    NEED_INIT();
    *count = (unsigned)M.ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    NEED_INIT();
    if (index >= (unsigned)M.ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &M.gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **device) {
    NEED_INIT();
    for (int i = 0; i < M.ngpus; i++) {
        gpu_t *g = &M.gpus[i];
        if (!strcmp(g->uuid, uuid)) { *device = g; return NVML_SUCCESS; }
        for (int k = 0; k < MAX_INSTANCES; k++)
            if (g->gis[k].alive && g->gis[k].ci.alive && !strcmp(g->gis[k].ci.uuid, uuid)) {
                *device = &g->gis[k].ci;
                return NVML_SUCCESS;
            }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (g) return copy_str(uuid, length, g->uuid);
    ci_t *c = as_mig(device);
    if (c) return copy_str(uuid, length, c->uuid);
    return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned int length) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    return copy_str(name, length, g->name);
}

nvmlReturn_t nvmlDeviceGetIndex(void *device, unsigned int *index) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)g->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->lost) return NVML_ERROR_GPU_IS_LOST;
    memory->total = g->memory_mib * 1024ULL * 1024ULL;
    memory->used = (unsigned long long)g->memory_used_mib * 1024ULL * 1024ULL; /* unsigned, as the driver's */
    memory->free = memory->used > memory->total ? 0 : memory->total - memory->used;
    return NVML_SUCCESS;
}

typedef struct { unsigned gpu, memory; } nvmlUtilization_t;

/* The readings: a figure configured as -1 (the default) is not supported; any other is handed out as the
 * unsigned value the driver's ABI has, so a configured negative reads as the driver's garbage would. */
nvmlReturn_t nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *rates) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->lost) return NVML_ERROR_GPU_IS_LOST;
    if (g->utilization == -1) return NVML_ERROR_NOT_SUPPORTED;
    rates->gpu = (unsigned)g->utilization;
    rates->memory = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(void *device, unsigned int *milliwatts) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->lost) return NVML_ERROR_GPU_IS_LOST;
    if (g->power_mw == -1) return NVML_ERROR_NOT_SUPPORTED;
    *milliwatts = (unsigned)g->power_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(void *device, int sensor, unsigned int *celsius) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->lost) return NVML_ERROR_GPU_IS_LOST;
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT; /* NVML_TEMPERATURE_GPU is the only sensor */
    if (g->temperature == -1) return NVML_ERROR_NOT_SUPPORTED;
    *celsius = (unsigned)g->temperature;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *device, nvmlPciInfo_t *pci) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(pci, g->bus);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(void *a, void *b, int *level) {
    NEED_INIT();
    gpu_t *x = as_gpu(a), *y = as_gpu(b);
    if (!x || !y) return NVML_ERROR_INVALID_ARGUMENT;
    *level = M.topology[x->index][y->index];
    return NVML_SUCCESS;
}

/* ----------------------------------------------------------------------------------------------------- */
/* NVLink                                                                                                */
/* ----------------------------------------------------------------------------------------------------- */

static nvmlReturn_t link_of(void *device, unsigned link, gpu_t **out) {
    gpu_t *g = as_gpu(device);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->has_links) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned)g->nlinks) return NVML_ERROR_INVALID_ARGUMENT;
    *out = g;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(void *device, unsigned int link, unsigned int *isActive) {
    NEED_INIT();
    gpu_t *g;
    nvmlReturn_t r = link_of(device, link, &g);
    if (r) return r;
    *isActive = (unsigned)g->link_state[link];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(void *device, unsigned int link, nvmlPciInfo_t *pci) {
    NEED_INIT();
    gpu_t *g;
    nvmlReturn_t r = link_of(device, link, &g);
    if (r) return r;
    if (!strcmp(g->link_remote[link], "switch")) {
        char bus[32];
        snprintf(bus, sizeof(bus), "00000000:%02X:00.0", 0xC0 + (int)link % 4);
        fill_pci(pci, bus);
    } else {
        fill_pci(pci, g->link_remote[link]);
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(void *device, unsigned int link, int *type) {
    NEED_INIT();
    gpu_t *g;
    nvmlReturn_t r = link_of(device, link, &g);
    if (r) return r;
    *type = strcmp(g->link_remote[link], "switch") ? 0 : 2;
    return NVML_SUCCESS;
}

/* ----------------------------------------------------------------------------------------------------- */
/* MIG                                                                                                   */
/* ----------------------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetMigMode(void *device, unsigned int *current, unsigned int *pending) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->nprofiles && !g->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned)g->mig_mode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(void *device, unsigned int *isMig) {
    NEED_INIT();
    *isMig = as_mig(device) != NULL;
    return as_gpu(device) || *isMig ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(void *device, unsigned int profile,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != GI_PROFILE_INFO_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!g->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    profile_t *p = find_profile(g, profile);
    if (!p) return NVML_ERROR_NOT_SUPPORTED;
    unsigned version = info->version;
    memset(info, 0, sizeof(*info));
    info->version = version;
    info->id = p->id;
    info->isP2pSupported = 1;
    info->sliceCount = p->slices;
    info->instanceCount = p->instances;
    info->multiprocessorCount = p->sms;
    info->copyEngineCount = p->slices;
    info->memorySizeMB = p->memory_mib;
    snprintf(info->name, sizeof(info->name), "%s", p->name);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(void *device, unsigned int profileId,
                                                           nvmlPlacement_t *placements, unsigned int *count) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (!g || !count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    profile_t *p = find_profile(g, profileId);
    if (!p) return NVML_ERROR_NOT_SUPPORTED;
    if (!placements) { *count = (unsigned)p->nplacements; return NVML_SUCCESS; }
    if (*count < (unsigned)p->nplacements) { *count = (unsigned)p->nplacements; return NVML_ERROR_INSUFFICIENT_SIZE; }
    for (int i = 0; i < p->nplacements; i++) placements[i] = p->placements[i];
    *count = (unsigned)p->nplacements;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(void *device, unsigned int profileId,
                                                      const nvmlPlacement_t *placement, void **gpuInstance) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (!g || !placement) return NVML_ERROR_INVALID_ARGUMENT;
    gi_t *made;
    nvmlReturn_t r = create_gi(g, profileId, *placement, &made);
    logline("{\"call\":\"create_gpu_instance\",\"gpu\":\"%s\",\"profile\":%u,\"start\":%u,\"size\":%u,"
            "\"result\":%d,\"id\":%u}",
            g->uuid, profileId, placement->start, placement->size, r, r == NVML_SUCCESS ? made->id : 0u);
    if (r) return r;
    *gpuInstance = made;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstances(void *device, unsigned int profileId, void **instances, unsigned int *count) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (!g || !count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    unsigned n = 0;
    for (int i = 0; i < MAX_INSTANCES; i++) {
        gi_t *o = &g->gis[i];
        if (!o->alive || o->profile_id != profileId) continue;
        if (instances) instances[n] = o;
        n++;
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(void *device, unsigned int id, void **gpuInstance) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < MAX_INSTANCES; i++)
        if (g->gis[i].alive && g->gis[i].id == id) { *gpuInstance = &g->gis[i]; return NVML_SUCCESS; }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(void *gpuInstance, nvmlGpuInstanceInfo_t *info) {
    NEED_INIT();
    gi_t *g = as_gi(gpuInstance);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    info->device = g->gpu;
    info->id = g->id;
    info->profileId = g->profile_id;
    info->placement = g->placement;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(void *gpuInstance, unsigned int profile,
                                                          unsigned int engProfile,
                                                          nvmlComputeInstanceProfileInfo_v2_t *info) {
    NEED_INIT();
    gi_t *g = as_gi(gpuInstance);
    if (!g || engProfile != 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != CI_PROFILE_INFO_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    profile_t *p = find_profile(g->gpu, g->profile_id);
    static const unsigned slices_of[] = {1, 2, 3, 4, 7, 8, 6};
    if (profile >= sizeof(slices_of) / sizeof(slices_of[0])) return NVML_ERROR_NOT_SUPPORTED;
    unsigned slices = slices_of[profile];
    if (!p || slices > p->slices) return NVML_ERROR_NOT_SUPPORTED;
    unsigned version = info->version;
    memset(info, 0, sizeof(*info));
    info->version = version;
    info->id = profile;
    info->sliceCount = slices;
    info->instanceCount = p->slices / slices;
    info->multiprocessorCount = p->sms * slices / p->slices;
    snprintf(info->name, sizeof(info->name), "MIG %uc.%s", slices, p->name + (strncmp(p->name, "MIG ", 4) ? 0 : 4));
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(void *gpuInstance, unsigned int profileId, void **computeInstance) {
    NEED_INIT();
    gi_t *g = as_gi(gpuInstance);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = g->ci.alive ? NVML_ERROR_INSUFFICIENT_RESOURCES : NVML_SUCCESS;
    if (!r) {
        create_ci(g, profileId);
        *computeInstance = &g->ci;
    }
    logline("{\"call\":\"create_compute_instance\",\"gpu\":\"%s\",\"gpu_instance\":%u,\"profile\":%u,\"result\":%d,"
            "\"uuid\":\"%s\"}",
            g->gpu->uuid, g->id, profileId, r, r ? "" : g->ci.uuid);
    return r;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(void *gpuInstance, unsigned int profileId, void **instances,
                                                unsigned int *count) {
    NEED_INIT();
    gi_t *g = as_gi(gpuInstance);
    if (!g || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    if (g->ci.alive && g->ci.profile_id == profileId) {
        if (instances) instances[0] = &g->ci;
        n = 1;
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(void *computeInstance, nvmlComputeInstanceInfo_t *info) {
    NEED_INIT();
    ci_t *c = as_mig(computeInstance);
    if (!c) return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof(*info));
    info->device = c->gi->gpu;
    info->gpuInstance = c->gi;
    info->id = c->id;
    info->profileId = c->profile_id;
    return NVML_SUCCESS;
}

static int in_use(gi_t *g) {
    for (int i = 0; i < g->gpu->nprocs; i++)
        if (g->gpu->proc_gi[i] == g->id) return 1;
    return 0;
}

nvmlReturn_t nvmlComputeInstanceDestroy(void *computeInstance) {
    NEED_INIT();
    ci_t *c = as_mig(computeInstance);
    if (!c) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = in_use(c->gi) ? NVML_ERROR_IN_USE : NVML_SUCCESS;
    logline("{\"call\":\"destroy_compute_instance\",\"gpu\":\"%s\",\"gpu_instance\":%u,\"id\":%u,\"result\":%d}",
            c->gi->gpu->uuid, c->gi->id, c->id, r);
    if (!r) c->alive = 0;
    return r;
}

nvmlReturn_t nvmlGpuInstanceDestroy(void *gpuInstance) {
    NEED_INIT();
    gi_t *g = as_gi(gpuInstance);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = (g->ci.alive || in_use(g)) ? NVML_ERROR_IN_USE : NVML_SUCCESS;
    logline("{\"call\":\"destroy_gpu_instance\",\"gpu\":\"%s\",\"id\":%u,\"start\":%u,\"size\":%u,\"result\":%d}",
            g->gpu->uuid, g->id, g->placement.start, g->placement.size, r);
    if (!r) g->alive = 0;
    return r;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *device, unsigned int *count) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    *count = g->mig_mode ? 7 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *device, unsigned int index, void **mig) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    for (int i = 0; i < MAX_INSTANCES; i++) {
        gi_t *o = &g->gis[i];
        if (!o->alive || !o->ci.alive) continue;
        if (n++ == index) { *mig = &o->ci; return NVML_SUCCESS; }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *mig, void **device) {
    NEED_INIT();
    ci_t *c = as_mig(mig);
    if (!c) return NVML_ERROR_INVALID_ARGUMENT;
    *device = c->gi->gpu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *mig, unsigned int *id) {
    NEED_INIT();
    ci_t *c = as_mig(mig);
    if (!c) return NVML_ERROR_INVALID_ARGUMENT;
    *id = c->gi->id;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *mig, unsigned int *id) {
    NEED_INIT();
    ci_t *c = as_mig(mig);
    if (!c) return NVML_ERROR_INVALID_ARGUMENT;
    *id = c->id;
    return NVML_SUCCESS;
}

/* ----------------------------------------------------------------------------------------------------- */
/* Events                                                                                                */
/* ----------------------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlEventSetCreate(void **set) {
    NEED_INIT();
    event_set_t *s = calloc(1, sizeof(*s));
    s->tag = TAG_SET;
    *set = s;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetFree(void *set) {
    event_set_t *s = set;
    if (!s || s->tag != TAG_SET) return NVML_ERROR_INVALID_ARGUMENT;
    s->tag = 0;
    free(s);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *device, unsigned long long *types) {
    NEED_INIT();
    if (!as_gpu(device)) return NVML_ERROR_INVALID_ARGUMENT;
    *types = EVENT_XID_CRITICAL | 1ULL /* single-bit ECC */ | 2ULL /* double-bit ECC */;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(void *device, unsigned long long types, void *set) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    event_set_t *s = set;
    if (!g || !s || s->tag != TAG_SET) return NVML_ERROR_INVALID_ARGUMENT;
    if (types & EVENT_XID_CRITICAL) s->registered[g->index] = 1;
    return NVML_SUCCESS;
}

static nvmlReturn_t deliver(gpu_t *g, unsigned xid, nvmlEventData_t *data) {
    memset(data, 0, sizeof(*data));
    data->device = g;
    data->eventType = EVENT_XID_CRITICAL;
    data->eventData = xid;
    data->gpuInstanceId = NO_INSTANCE;
    data->computeInstanceId = NO_INSTANCE;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned int timeoutms) {
    (void)timeoutms;
    NEED_INIT();
    event_set_t *s = set;
    if (!s || s->tag != TAG_SET) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < M.ngpus; i++) {
        gpu_t *g = &M.gpus[i];
        if (s->registered[i] && g->xids_delivered < g->nxids) return deliver(g, g->xids[g->xids_delivered++], data);
    }
    const char *path = getenv("FAKE_NVML_EVENTS");
    FILE *f = path && *path ? fopen(path, "r") : NULL;
    if (f) {
        char line[128];
        fseek(f, s->events_offset, SEEK_SET);
        while (fgets(line, sizeof(line), f)) {
            s->events_offset = ftell(f);
            int index;
            unsigned xid;
            if (sscanf(line, "%d %u", &index, &xid) == 2 && index >= 0 && index < M.ngpus && s->registered[index]) {
                fclose(f);
                return deliver(&M.gpus[index], xid, data);
            }
        }
        fclose(f);
    }
    return NVML_ERROR_TIMEOUT;
}

/* ---- running compute processes ------------------------------------------------------------------------------ */

/* nvml.h (R520+): one entry of nvmlDeviceGetComputeRunningProcesses_v3. usedGpuMemory is in bytes (the context's
 * reservation included, as the driver reports it); gpuInstanceId/computeInstanceId are 0xFFFFFFFF off MIG. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

/* The compute processes of a device: the process table FAKE_NVML_PROCESSES names (core's fake_processes.h: lines
 * "<device index> <pid> <used bytes>", read at every call; a test appends to it as processes come and go). As NVML
 * documents: *infoCount is the capacity of `infos` on the way in and the number of processes on the way out; too
 * small a buffer (a NULL one with count 0 is how callers ask the size) gives NVML_ERROR_INSUFFICIENT_SIZE with
 * *infoCount set to the number needed. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *infoCount, nvmlProcessInfo_t *infos) {
    NEED_INIT();
    gpu_t *g = as_gpu(device);
    if (!g || !infoCount) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->lost) return NVML_ERROR_GPU_IS_LOST;
    struct fake_process found[256];
    int n = fake_processes("FAKE_NVML_PROCESSES", g->index, found, 256);
    if (n < 0 || n > 256) return NVML_ERROR_UNKNOWN;
    unsigned int room = infos ? *infoCount : 0;
    *infoCount = (unsigned int)n;
    if ((unsigned int)n > room) return NVML_ERROR_INSUFFICIENT_SIZE;
    for (int i = 0; i < n; i++) {
        infos[i].pid = found[i].pid;
        infos[i].usedGpuMemory = found[i].bytes;
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    return NVML_SUCCESS;
}
