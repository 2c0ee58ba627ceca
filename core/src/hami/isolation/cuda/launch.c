/*
 * launch.c: every way work reaches the device (cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel,
 * cuGraphLaunch, and their per-thread-default-stream variants) passes the core's compute limiter first. The
 * launch-config launches (cuLaunchKernelEx) hand the driver a copy of the caller's config, read once: what the
 * limiter admitted and timed is what runs.
 *
 * When the limiter asks for a measurement, the core's launch timer (hookkit.c) brackets the launch by two of the
 * driver's events on its own stream (event pairs per thread, created once per context); the elapsed time between
 * them is the device's time for that launch, read later without waiting, or at once when the limiter has no
 * estimate yet. A stream being captured into a graph is never bracketed (that would add nodes to the user's
 * graph). Without a limit the fast path is one call into the core and the driver's launch.
 *
 * Events can only tell how long the device took from the start event to the end, which includes other contexts'
 * work the device ran in between (a device that time-slices contexts). So the limiter also asks, every 50 ms
 * (hami_iso_vendor.device_busy), for the device time the device itself counted for this process: NVML's
 * per-process utilization (nvmlDeviceGetProcessUtilization: each of this process's samples counts its smUtil
 * percent of the window its timestamp closes, place_samples below, whatever span the driver meant it for), when
 * the vendor names an NVML-compatible library and it has the function. A pause of more than a second between
 * questions starts over (the span since the last sample could be counted at a later second's percentage). NVML names processes by
 * their pid in the host's pid namespace. A process in that namespace (a pod with hostPID, or no container) finds
 * itself by getpid(); one in a container's pid namespace by the host pid the node daemon's map in its grant
 * directory gives it (hami_iso_host_pid, GRANT.md "pids": read-only in the container, written from the host's
 * /proc). Without that map (no node daemon, or the process is not listed yet) its own pid could be another
 * process's on the host, and taking that process's figures as ours could lift the limit: there, and until NVML
 * has once shown the pid busy, the answer is "unknown" and the limiter uses its event timing alone.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hami_cuda.h"

int hami_cu_stream_capturing(void *stream) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (!hami_real.HAMI_CU(StreamIsCapturing)) return 0;
    if (hami_real.HAMI_CU(StreamIsCapturing)((CUstream)stream, &status) != CUDA_SUCCESS) return 0;
    return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* ---- what the device counted for this process (NVML) ---------------------------------------------------- */

#ifdef HAMI_CUDA_NVML_LIBRARIES
#define BUSY_SAMPLES 64
#define BUSY_GAP_US 1000000ull /* a longer pause between questions starts over (see below) */

static _Atomic int g_nvml_up; /* 0 not tried, 1 initialized, -1 unavailable */
static unsigned long long g_last_seen[HAMI_ISO_MAX_DEVICES]; /* microseconds, CLOCK_REALTIME; 0: never asked */
static int g_pid_seen[HAMI_ISO_MAX_DEVICES];                 /* NVML has shown this pid busy on the device */
static unsigned long long g_asked[HAMI_ISO_MAX_DEVICES];     /* microseconds, CLOCK_REALTIME, of the last question */
static unsigned g_owner;                                     /* the host pid these are about */
static int g_host_namespace;                                 /* 1: this process is in the host's pid namespace */
static unsigned g_told;                                      /* the host pid last logged (~0u: unmapped; 0: nothing yet) */

#define HOST_PID_NAMESPACE "pid:[4026531836]" /* the initial pid namespace's inode (PROC_PID_INIT_INO) */

static int in_host_pid_namespace(void) {
    char link[64];
    ssize_t n = readlink("/proc/self/ns/pid", link, sizeof link - 1);
    if (n <= 0) return 0;
    link[n] = 0;
    return !strcmp(link, HOST_PID_NAMESPACE);
}

static unsigned long long wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000ull;
}

/* Places the samples NVML returned for lastSeenTimeStamp `since` on the CPU clock, and adds up the device time of
 * `pid`'s: the documentation gives each sample a timestamp and leaves open what span its smUtil covers (since
 * lastSeenTimeStamp, the last second, or a sampling period the driver chose; several samples per process may
 * come back). Whatever the reading, the samples' timestamps cut (since, newest] into consecutive windows, each
 * ending at one timestamp, and a sample counts for its window alone: so no stretch of time is counted twice
 * (several samples, or overlapping periods), and no more device time than wall time is ever counted (a percent of
 * the window). A sample stamped at or before `since` or after `now` (another clock, a buffer replayed) cannot be
 * placed and is ignored. Returns the newest timestamp placed (`since` when none was), and sets *seen when `pid`
 * had a busy sample. */
static unsigned long long place_samples(nvmlProcessUtilizationSample_t *samples, unsigned count, unsigned pid,
                                        unsigned long long since, unsigned long long now, uint64_t *busy,
                                        int *seen) {
    unsigned placed = 0;
    for (unsigned i = 0; i < count; i++) /* keep the placeable ones, in timestamp order (insertion sort: <= 64) */
        if (samples[i].timeStamp > since && samples[i].timeStamp <= now) {
            nvmlProcessUtilizationSample_t x = samples[i];
            unsigned j = placed++;
            for (; j > 0 && samples[j - 1].timeStamp > x.timeStamp; j--) samples[j] = samples[j - 1];
            samples[j] = x;
        }
    unsigned long long edge = since;
    for (unsigned i = 0; i < placed;) {
        unsigned long long stamp = samples[i].timeStamp;
        unsigned util = 0;
        for (; i < placed && samples[i].timeStamp == stamp; i++) /* one window per timestamp, one share per pid */
            if (samples[i].pid == pid && samples[i].smUtil > util) util = samples[i].smUtil;
        if (util > 100) util = 100;
        *busy += (uint64_t)util * (stamp - edge) * 10u; /* percent of microseconds, in ns */
        if (util) *seen = 1;
        edge = stamp;
    }
    return edge;
}

/* The core's limiter calls this for one device at a time, at most every 50 ms (limiter.c). */
/* NVML, initialized once, and `device`'s handle: 0, or -1 when there is none. */
static int nvml_handle(int device, nvmlDevice_t *handle) {
    if ((unsigned)device >= HAMI_ISO_MAX_DEVICES || !hami_cu_nvml()) return -1;
    if (!hami_real.nvmlInit_v2 || !hami_real.nvmlDeviceGetHandleByIndex_v2) return -1;
    int up = atomic_load(&g_nvml_up);
    if (!up) {
        g_host_namespace = in_host_pid_namespace();
        up = hami_real.nvmlInit_v2() == NVML_SUCCESS ? 1 : -1;
        atomic_store(&g_nvml_up, up);
    }
    if (up < 0) return -1;
    return hami_real.nvmlDeviceGetHandleByIndex_v2((unsigned)device, handle) == NVML_SUCCESS ? 0 : -1;
}

/* The core's memory accounting calls this when the container's figures are in doubt (region.c): what NVML's
 * process list (nvmlDeviceGetComputeRunningProcesses, its first record: pid and bytes, which every NVML-compatible
 * library has) counts on `device` for the host pids given. A figure NVML cannot give makes the answer unknown. */
int hami_cu_process_memory(int device, const unsigned *host_pids, size_t count, uint64_t *bytes) {
    nvmlDevice_t handle;
    if (nvml_handle(device, &handle) != 0 || !hami_real.nvmlDeviceGetComputeRunningProcesses) return -1;
    nvmlProcessInfo_v1_t small[64], *infos = small;
    unsigned n = 64;
    nvmlReturn_t r = hami_real.nvmlDeviceGetComputeRunningProcesses(handle, &n, infos);
    for (int tries = 0; r == NVML_ERROR_INSUFFICIENT_SIZE && tries < 3; tries++) {
        if (infos != small) free(infos);
        n += 16;
        infos = malloc(n * sizeof *infos);
        if (!infos) return -1;
        r = hami_real.nvmlDeviceGetComputeRunningProcesses(handle, &n, infos);
    }
    uint64_t sum = 0;
    int known = r == NVML_SUCCESS;
    for (unsigned i = 0; known && i < n; i++)
        for (size_t j = 0; j < count; j++)
            if (infos[i].pid == host_pids[j]) {
                if (infos[i].usedGpuMemory == ~0ull) known = 0; /* NVML_VALUE_NOT_AVAILABLE */
                sum += infos[i].usedGpuMemory;
                break;
            }
    if (infos != small) free(infos);
    if (!known) return -1;
    *bytes = sum;
    return 0;
}

int hami_cu_device_busy(int device, uint64_t *busy_ns) {
    nvmlDevice_t handle;
    if (nvml_handle(device, &handle) != 0 || !hami_real.nvmlDeviceGetProcessUtilization) return -1;
    unsigned pid = (unsigned)getpid();
    if (!g_host_namespace) { /* NVML's pids are the host's: only the node daemon's map says which one is ours */
        unsigned host = 0;
        int mapped = hami_iso_host_pid(&host);
        if ((mapped ? host : ~0u) != g_told) {
            g_told = mapped ? host : ~0u;
            if (mapped)
                HAMI_LOG(HAMI_LOG_INFO, "pid %u is host pid %u (the node daemon's map): the compute limit follows "
                         "NVML's figures for it", pid, host);
            else
                HAMI_LOG(HAMI_LOG_INFO, "not in the host's pid namespace: the compute limit is held by event "
                         "timing alone");
        }
        if (!mapped) return -1;
        pid = host;
    }
    if (g_owner != pid) { /* a forked child, or the map names another pid: what was shown is not ours */
        memset(g_last_seen, 0, sizeof g_last_seen);
        memset(g_pid_seen, 0, sizeof g_pid_seen);
        g_owner = pid;
    }
    unsigned long long since = g_last_seen[device], now = wall_us(), asked = g_asked[device];
    g_asked[device] = now;
    if (!since || now - asked > BUSY_GAP_US || since > now) { /* the first question, or the first after a pause */
        g_last_seen[device] = now;
        return -1;
    }
    nvmlProcessUtilizationSample_t samples[BUSY_SAMPLES];
    unsigned count = BUSY_SAMPLES;
    nvmlReturn_t r = hami_real.nvmlDeviceGetProcessUtilization(handle, samples, &count, since);
    if (r == NVML_ERROR_NOT_FOUND) return 1; /* no sample since then: nothing new */
    if (r != NVML_SUCCESS) return -1;       /* more processes than samples here, or an error: not known */
    uint64_t busy = 0;
    unsigned long long until = place_samples(samples, count < BUSY_SAMPLES ? count : BUSY_SAMPLES, pid, since, now,
                                             &busy, &g_pid_seen[device]);
    if (until == since) return 1; /* nothing it could place */
    g_last_seen[device] = until;
    if (!g_pid_seen[device]) return -1; /* NVML has not known this process yet (another pid namespace?) */
    *busy_ns = busy;
    return 0;
}
#else
int hami_cu_device_busy(int device, uint64_t *busy_ns) {
    (void)device;
    (void)busy_ns;
    return -1;
}

int hami_cu_process_memory(int device, const unsigned *host_pids, size_t count, uint64_t *bytes) {
    (void)device;
    (void)host_pids;
    (void)count;
    (void)bytes;
    return -1;
}
#endif

/* The driver's events, for the core's launch timer (hookkit.c). */
static int event_create(void **event) { return hami_real.HAMI_CU(EventCreate)((CUevent *)event, CU_EVENT_DEFAULT); }
static void event_destroy(void *event) {
    if (hami_real.HAMI_CU(EventDestroy_v2)) hami_real.HAMI_CU(EventDestroy_v2)((CUevent)event);
}
static int event_record(void *event, void *stream) { return hami_real.HAMI_CU(EventRecord)((CUevent)event, (CUstream)stream); }
static int event_query(void *event) { return hami_real.HAMI_CU(EventQuery)((CUevent)event); }
static int event_elapsed(float *ms, void *start, void *end) {
    return hami_real.HAMI_CU(EventElapsedTime)(ms, (CUevent)start, (CUevent)end);
}
static int event_synchronize(void *event) { return hami_real.HAMI_CU(EventSynchronize)((CUevent)event); }

static hami_iso_events g_events = {
    .api = HAMI_STR(HAMI_CU(Event)),
    .destroy = event_destroy,
    .capturing = hami_cu_stream_capturing,
};
static pthread_once_t g_events_once = PTHREAD_ONCE_INIT;

static void find_events(void) { /* the event table lists only the functions the driver has */
    if (hami_real.HAMI_CU(EventCreate)) g_events.create = event_create;
    if (hami_real.HAMI_CU(EventRecord)) g_events.record = event_record;
    if (hami_real.HAMI_CU(EventQuery)) g_events.query = event_query;
    if (hami_real.HAMI_CU(EventElapsedTime)) g_events.elapsed_ms = event_elapsed;
    if (hami_real.HAMI_CU(EventSynchronize)) g_events.synchronize = event_synchronize;
}

/* The events' owner is the thread's context (events belong to one); with none the launch fails anyway: untimed. */
static const hami_iso_events *events_for_thread(void) {
    pthread_once(&g_events_once, find_events);
    (void)hami_cu_device();
    return hami_cu_tls.valid ? &g_events : NULL;
}

static inline CUstream event_stream(CUstream stream, int per_thread) {
    return (per_thread && !stream) ? CU_STREAM_PER_THREAD : stream;
}

#define LAUNCH(name, per_thread, kernel, work, stream, call)                                                   \
    HAMI_CUDA_ENTER(name);                                                                                     \
    HAMI_ISO_LAUNCH(events_for_thread(), hami_cu_device(), (uint64_t)(uintptr_t)hami_cu_tls.context, (kernel), \
                    (work), event_stream((stream), (per_thread)), CUresult, hami_real.call);

#define BLOCKS(x, y, z) ((uint64_t)(x) * (uint64_t)(y) * (uint64_t)(z))

HAMI_EXPORT CUresult HAMI_CU(LaunchKernel)(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                    unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                    unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                                    void **extra) {
    LAUNCH(HAMI_CU(LaunchKernel), 0, f, BLOCKS(gridDimX, gridDimY, gridDimZ), hStream,
           HAMI_CU(LaunchKernel)(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                          kernelParams, extra))
}

HAMI_EXPORT CUresult HAMI_CU(LaunchKernel_ptsz)(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                         unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                         unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                         void **kernelParams, void **extra) {
    LAUNCH(HAMI_CU(LaunchKernel_ptsz), 1, f, BLOCKS(gridDimX, gridDimY, gridDimZ), hStream,
           HAMI_CU(LaunchKernel_ptsz)(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                               hStream, kernelParams, extra))
}

/* cuLaunchKernelEx: the grid and the stream are in the caller's config. The driver is handed a copy read once, so
 * what the limiter admitted and timed (its blocks, and the stream the launch timer records its events on) is what
 * runs, whatever another thread of the tenant writes into the caller's struct meanwhile (a stream swapped between
 * the two reads would run the kernel untimed, past the core limit). The copy assumes the struct is the driver's to
 * its last field, as CUDA's header defines CUlaunchConfig (cuda_api.h); Moore Threads' MUlaunchConfig is CUDA's by
 * the layer's parity. The attributes (attrs) stay the caller's: the limiter reads none of them. A NULL config
 * describes no work: it goes straight to the driver, which answers its own error. */
HAMI_EXPORT CUresult HAMI_CU(LaunchKernelEx)(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    if (!config) {
        HAMI_CUDA_ENTER(HAMI_CU(LaunchKernelEx));
        return hami_real.HAMI_CU(LaunchKernelEx)(config, f, kernelParams, extra);
    }
    const CUlaunchConfig copy = *config;
    LAUNCH(HAMI_CU(LaunchKernelEx), 0, f, BLOCKS(copy.gridDimX, copy.gridDimY, copy.gridDimZ), copy.hStream,
           HAMI_CU(LaunchKernelEx)(&copy, f, kernelParams, extra))
}

/* As cuLaunchKernelEx, on the per-thread default stream when the config's is NULL. */
HAMI_EXPORT CUresult HAMI_CU(LaunchKernelEx_ptsz)(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                           void **extra) {
    if (!config) {
        HAMI_CUDA_ENTER(HAMI_CU(LaunchKernelEx_ptsz));
        return hami_real.HAMI_CU(LaunchKernelEx_ptsz)(config, f, kernelParams, extra);
    }
    const CUlaunchConfig copy = *config;
    LAUNCH(HAMI_CU(LaunchKernelEx_ptsz), 1, f, BLOCKS(copy.gridDimX, copy.gridDimY, copy.gridDimZ), copy.hStream,
           HAMI_CU(LaunchKernelEx_ptsz)(&copy, f, kernelParams, extra))
}

HAMI_EXPORT CUresult HAMI_CU(LaunchCooperativeKernel)(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                               unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                               unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                               void **kernelParams) {
    LAUNCH(HAMI_CU(LaunchCooperativeKernel), 0, f, BLOCKS(gridDimX, gridDimY, gridDimZ), hStream,
           HAMI_CU(LaunchCooperativeKernel)(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                                     hStream, kernelParams))
}

HAMI_EXPORT CUresult HAMI_CU(LaunchCooperativeKernel_ptsz)(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                                    unsigned int gridDimZ, unsigned int blockDimX,
                                                    unsigned int blockDimY, unsigned int blockDimZ,
                                                    unsigned int sharedMemBytes, CUstream hStream,
                                                    void **kernelParams) {
    LAUNCH(HAMI_CU(LaunchCooperativeKernel_ptsz), 1, f, BLOCKS(gridDimX, gridDimY, gridDimZ), hStream,
           HAMI_CU(LaunchCooperativeKernel_ptsz)(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                                          sharedMemBytes, hStream, kernelParams))
}

HAMI_EXPORT CUresult HAMI_CU(GraphLaunch)(CUgraphExec hGraphExec, CUstream hStream) {
    LAUNCH(HAMI_CU(GraphLaunch), 0, hGraphExec, 1, hStream, HAMI_CU(GraphLaunch)(hGraphExec, hStream))
}

HAMI_EXPORT CUresult HAMI_CU(GraphLaunch_ptsz)(CUgraphExec hGraphExec, CUstream hStream) {
    LAUNCH(HAMI_CU(GraphLaunch_ptsz), 1, hGraphExec, 1, hStream, HAMI_CU(GraphLaunch_ptsz)(hGraphExec, hStream))
}
