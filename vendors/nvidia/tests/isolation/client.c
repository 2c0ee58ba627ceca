/*
 * client.c: the C program the isolation tests and the benchmark drive. It is an ordinary CUDA driver API
 * program (linked against libcuda.so.1, so its calls reach libvgpu.so's exported wrappers when that is
 * preloaded), with one subcommand per scenario:
 *
 *   init [LIMIT [whole]]          cuInit, a context, one small allocation; with LIMIT: LIMIT + 1 bytes must be
 *                                 refused; with "whole" also all of LIMIT must be allocatable, and one byte more
 *                                 refused (exit 4 otherwise)
 *   stress THREADS OPS MAX SEED   every thread allocates through every counted API and frees at random; prints
 *                                 {"ok": n, "oom": n}; exit 3 on any result but success or out-of-memory
 *   hold BYTES PIECES             allocates and waits to be killed (prints "held")
 *   churn MAX                     allocates and frees forever (to be killed at a random point)
 *   launch SECONDS MODE GRID...   launches kernels for SECONDS (MODE kernel|ptsz|ex|coop|graph|mixed)
 *   spawn N -- ARGV...            starts N processes at once, waits; prints {"ok", "failed", "seconds"}
 *   storm N PARALLEL MAX_US -- ARGV...   starts N processes, PARALLEL at a time, SIGKILLs each after a random
 *                                 delay up to MAX_US; prints {"killed", "exited"}
 *   bench alloc|launch|meminfo N  nanoseconds per call (best of 7 rounds of N)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;

struct location { int type, id; };
struct alloc_prop { int type, handle_types; struct location location; void *win32; unsigned char flags[8]; };
struct pool_props { int alloc_type, handle_types; struct location location; void *win32; size_t max; unsigned short usage; unsigned char reserved[54]; };
struct array_desc { size_t width, height; int format; unsigned channels; };
struct array3d_desc { size_t width, height, depth; int format; unsigned channels, flags; };
struct launch_config { unsigned gx, gy, gz, bx, by, bz, shmem; CUstream stream; void *attrs; unsigned nattrs; };

CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, int);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemCreate(unsigned long long *, size_t, const struct alloc_prop *, unsigned long long);
CUresult cuMemRelease(unsigned long long);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemPoolCreate(void **, const struct pool_props *);
CUresult cuMemPoolDestroy(void *);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, void *, CUstream);
CUresult cuArrayCreate_v2(void **, const struct array_desc *);
CUresult cuArray3DCreate_v2(void **, const struct array3d_desc *);
CUresult cuArrayDestroy(void *);
CUresult cuMipmappedArrayCreate(void **, const struct array3d_desc *, unsigned);
CUresult cuMipmappedArrayDestroy(void *);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernel_ptsz(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx(const struct launch_config *, void *, void **, void **);
CUresult cuLaunchCooperativeKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
CUresult cuGraphLaunch(void *, CUstream);

enum { OK = 0, OOM = 2 };

static void die(const char *what, CUresult r) {
    fprintf(stderr, "client: %s returned %d\n", what, r);
    exit(3);
}

static void check(const char *what, CUresult r) {
    if (r != OK) die(what, r);
}

static void do_init(void) { check("cuInit", cuInit(0)); }

static void use_device(int device) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, do_init);
    CUcontext ctx;
    check("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&ctx, device));
    check("cuCtxSetCurrent", cuCtxSetCurrent(ctx));
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t rnd(uint64_t *state) { /* xorshift64* */
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return *state * 2685821657736338717ull;
}

/* ---- allocations through every counted API --------------------------------------------------------------- */

enum { A_ALLOC, A_PITCH, A_MANAGED, A_ASYNC, A_ASYNC_PTSZ, A_POOL, A_VMM, A_ARRAY, A_ARRAY3D, A_MIPMAP, A_KINDS };

struct held {
    int kind;
    unsigned long long handle;
};

static CUresult allocate(int kind, size_t bytes, void *pool, struct held *h) {
    CUdeviceptr p = 0;
    void *a = NULL;
    size_t pitch;
    CUresult r;
    h->kind = kind;
    switch (kind) {
    case A_ALLOC: r = cuMemAlloc_v2(&p, bytes); break;
    case A_PITCH: r = cuMemAllocPitch_v2(&p, &pitch, 1000, bytes / 1024 + 1, 4); break;
    case A_MANAGED: r = cuMemAllocManaged(&p, bytes, 1); break;
    case A_ASYNC: r = cuMemAllocAsync(&p, bytes, NULL); break;
    case A_ASYNC_PTSZ: r = cuMemAllocAsync_ptsz(&p, bytes, NULL); break;
    case A_POOL: r = cuMemAllocFromPoolAsync(&p, bytes, pool, NULL); break;
    case A_VMM: {
        struct alloc_prop prop = {1, 0, {1, 0}, NULL, {0}};
        unsigned long long handle = 0;
        r = cuMemCreate(&handle, bytes, &prop, 0);
        h->handle = handle;
        return r;
    }
    case A_ARRAY: {
        struct array_desc d = {1024, bytes / 4096 + 1, 0x20, 1};
        r = cuArrayCreate_v2(&a, &d);
        h->handle = (uintptr_t)a;
        return r;
    }
    case A_ARRAY3D: {
        struct array3d_desc d = {256, 16, bytes / 8192 + 1, 0x02, 1, 0};
        r = cuArray3DCreate_v2(&a, &d);
        h->handle = (uintptr_t)a;
        return r;
    }
    default: {
        struct array3d_desc d = {512, bytes / 4096 + 1, 0, 0x01, 4, 0};
        r = cuMipmappedArrayCreate(&a, &d, 4);
        h->handle = (uintptr_t)a;
        return r;
    }
    }
    h->handle = p;
    return r;
}

static void release(struct held *h) {
    switch (h->kind) {
    case A_VMM: check("cuMemRelease", cuMemRelease(h->handle)); break;
    case A_ARRAY: case A_ARRAY3D: check("cuArrayDestroy", cuArrayDestroy((void *)(uintptr_t)h->handle)); break;
    case A_MIPMAP: check("cuMipmappedArrayDestroy", cuMipmappedArrayDestroy((void *)(uintptr_t)h->handle)); break;
    case A_ASYNC: case A_POOL: check("cuMemFreeAsync", cuMemFreeAsync(h->handle, NULL)); break;
    default: check("cuMemFree_v2", cuMemFree_v2(h->handle)); break;
    }
}

static void *make_pool(void) {
    struct pool_props props;
    memset(&props, 0, sizeof props);
    props.alloc_type = 1;
    props.location.type = 1;
    props.location.id = 0;
    void *pool = NULL;
    check("cuMemPoolCreate", cuMemPoolCreate(&pool, &props));
    return pool;
}

struct stress_args {
    long ops;
    size_t max;
    uint64_t seed;
    long ok, oom;
};

static void *stress_thread(void *arg) {
    struct stress_args *s = arg;
    use_device(0);
    void *pool = make_pool();
    struct held held[8];
    int count = 0;
    uint64_t state = s->seed | 1;
    for (long i = 0; i < s->ops; i++) {
        uint64_t x = rnd(&state);
        if (count < 8 && (count == 0 || x % 10 < 6)) {
            size_t bytes = 1 + (size_t)(rnd(&state) % s->max);
            int kind = (int)(rnd(&state) % A_KINDS);
            CUresult r = allocate(kind, bytes, pool, &held[count]);
            if (r == OK) {
                count++;
                s->ok++;
            } else if (r == OOM) {
                s->oom++;
            } else {
                die("allocation", r);
            }
        } else {
            int k = (int)(rnd(&state) % (uint64_t)count);
            release(&held[k]);
            held[k] = held[--count];
        }
    }
    while (count) release(&held[--count]);
    check("cuMemPoolDestroy", cuMemPoolDestroy(pool));
    return NULL;
}

static int cmd_stress(int threads, long ops, size_t max, uint64_t seed) {
    pthread_t tid[64];
    struct stress_args args[64];
    if (threads > 64) threads = 64;
    for (int t = 0; t < threads; t++) {
        args[t] = (struct stress_args){ops, max, seed * 1000003u + (uint64_t)t * 7919u + 1, 0, 0};
        pthread_create(&tid[t], NULL, stress_thread, &args[t]);
    }
    long ok = 0, oom = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        ok += args[t].ok;
        oom += args[t].oom;
    }
    printf("{\"ok\": %ld, \"oom\": %ld}\n", ok, oom);
    return 0;
}

static int cmd_init(size_t limit, int whole) {
    use_device(0);
    CUdeviceptr p, q;
    if (limit) {
        CUresult r = cuMemAlloc_v2(&q, limit + 1);
        if (r != OOM) {
            fprintf(stderr, "client: one byte over the limit was not refused: %d\n", r);
            return 4;
        }
    }
    if (limit && whole) {
        CUresult r = cuMemAlloc_v2(&p, limit);
        if (r != OK) {
            fprintf(stderr, "client: the whole limit (%zu bytes) was refused: %d\n", limit, r);
            return 4;
        }
        r = cuMemAlloc_v2(&q, 1);
        if (r != OOM) {
            fprintf(stderr, "client: one byte more than the limit was not refused: %d\n", r);
            return 4;
        }
        check("cuMemFree_v2", cuMemFree_v2(p));
    }
    check("cuMemAlloc_v2", cuMemAlloc_v2(&p, 1));
    check("cuMemFree_v2", cuMemFree_v2(p));
    return 0;
}

__attribute__((noreturn)) static void cmd_hold(size_t bytes, int pieces) {
    use_device(0);
    for (int i = 0; i < pieces; i++) {
        CUdeviceptr p;
        size_t piece = bytes / (size_t)pieces + (i == 0 ? bytes % (size_t)pieces : 0);
        check("cuMemAlloc_v2", cuMemAlloc_v2(&p, piece));
    }
    printf("held\n");
    fflush(stdout);
    for (;;) pause();
}

__attribute__((noreturn)) static void cmd_churn(size_t max) {
    use_device(0);
    uint64_t state = (uint64_t)getpid() * 2654435761u + 1;
    CUdeviceptr held[4] = {0};
    for (;;) {
        int k = (int)(rnd(&state) % 4);
        if (held[k]) {
            check("cuMemFree_v2", cuMemFree_v2(held[k]));
            held[k] = 0;
        } else {
            CUresult r = cuMemAlloc_v2(&held[k], 1 + (size_t)(rnd(&state) % max));
            if (r != OK && r != OOM) die("cuMemAlloc_v2", r);
            if (r != OK) held[k] = 0;
        }
    }
}

static int cmd_launch(double seconds, const char *mode, unsigned *grids, int ngrids) {
    use_device(0);
    void *kernels[4] = {(void *)0x1000, (void *)0x2000, (void *)0x3000, (void *)0x4000};
    long launches = 0;
    double end = now_s() + seconds;
    while (now_s() < end) {
        for (int i = 0; i < 16; i++, launches++) {
            unsigned grid = grids[launches % ngrids];
            void *kernel = kernels[launches % ngrids % 4];
            CUresult r;
            if (!strcmp(mode, "ptsz")) r = cuLaunchKernel_ptsz(kernel, grid, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
            else if (!strcmp(mode, "ex")) {
                struct launch_config c = {grid, 1, 1, 128, 1, 1, 0, NULL, NULL, 0};
                r = cuLaunchKernelEx(&c, kernel, NULL, NULL);
            } else if (!strcmp(mode, "coop"))
                r = cuLaunchCooperativeKernel(kernel, grid, 1, 1, 128, 1, 1, 0, NULL, NULL);
            else if (!strcmp(mode, "graph")) r = cuGraphLaunch(kernel, NULL);
            else r = cuLaunchKernel(kernel, grid, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
            if (r != OK) die("launch", r);
        }
    }
    cuCtxSynchronize();
    printf("{\"launches\": %ld}\n", launches);
    return 0;
}

/* ---- many processes ------------------------------------------------------------------------------------- */

static pid_t start(char **argv) {
    pid_t pid = fork();
    if (pid == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static int cmd_spawn(int n, char **argv) {
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    double t0 = now_s();
    for (int i = 0; i < n; i++) pids[i] = start(argv);
    int ok = 0, failed = 0;
    for (int i = 0; i < n; i++) {
        int status;
        if (waitpid(pids[i], &status, 0) == pids[i] && WIFEXITED(status) && WEXITSTATUS(status) == 0) ok++;
        else failed++;
    }
    printf("{\"ok\": %d, \"failed\": %d, \"seconds\": %.4f}\n", ok, failed, now_s() - t0);
    return 0;
}

static int cmd_storm(int n, int parallel, long max_us, char **argv) {
    struct child { pid_t pid; double kill_at; } *running = calloc((size_t)parallel, sizeof *running);
    uint64_t state = (uint64_t)getpid() * 977u + 12345u;
    int started = 0, killed = 0, exited = 0, alive = 0;
    while (started < n || alive) {
        for (int i = 0; i < parallel; i++) {
            if (!running[i].pid && started < n) {
                running[i].pid = start(argv);
                running[i].kill_at = now_s() + (double)(rnd(&state) % (uint64_t)(max_us + 1)) / 1e6;
                started++;
                alive++;
            }
            if (running[i].pid && now_s() >= running[i].kill_at) {
                int status;
                kill(running[i].pid, SIGKILL);
                waitpid(running[i].pid, &status, 0);
                if (WIFSIGNALED(status)) killed++;
                else exited++;
                running[i].pid = 0;
                alive--;
            }
        }
        usleep(200);
    }
    printf("{\"killed\": %d, \"exited\": %d}\n", killed, exited);
    return 0;
}

/* ---- benchmark ------------------------------------------------------------------------------------------ */

static double bench_round(const char *what, long n) {
    CUdeviceptr p;
    size_t free, total;
    double t0 = now_s();
    if (!strcmp(what, "alloc")) {
        for (long i = 0; i < n; i++) {
            if (cuMemAlloc_v2(&p, 1 << 20) != OK) die("cuMemAlloc_v2", 1);
            cuMemFree_v2(p);
        }
    } else if (!strcmp(what, "launch")) {
        for (long i = 0; i < n; i++) cuLaunchKernel((void *)0x1000, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    } else {
        for (long i = 0; i < n; i++) cuMemGetInfo_v2(&free, &total);
    }
    return (now_s() - t0) / (double)n * 1e9;
}

static int cmd_bench(const char *what, long n) {
    use_device(0);
    bench_round(what, n / 10 + 1); /* warm up: caches, estimates, the first timed launch */
    double best = 1e18;
    for (int round = 0; round < 7; round++) {
        double ns = bench_round(what, n);
        if (ns < best) best = ns;
    }
    printf("{\"ns\": %.2f}\n", best);
    return 0;
}

static char **after_dashes(int argc, char **argv, int from) {
    for (int i = from; i < argc; i++)
        if (!strcmp(argv[i], "--")) return argv + i + 1;
    fprintf(stderr, "client: missing -- ARGV\n");
    exit(2);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: client init|stress|hold|churn|launch|spawn|storm|bench ...\n");
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "init"))
        return cmd_init(argc > 2 ? strtoull(argv[2], NULL, 10) : 0, argc > 3 && !strcmp(argv[3], "whole"));
    if (!strcmp(cmd, "stress") && argc >= 6)
        return cmd_stress(atoi(argv[2]), atol(argv[3]), strtoull(argv[4], NULL, 10), strtoull(argv[5], NULL, 10));
    if (!strcmp(cmd, "hold") && argc >= 4) cmd_hold(strtoull(argv[2], NULL, 10), atoi(argv[3]));
    if (!strcmp(cmd, "churn") && argc >= 3) cmd_churn(strtoull(argv[2], NULL, 10));
    if (!strcmp(cmd, "launch") && argc >= 5) {
        unsigned grids[64];
        int n = 0;
        for (int i = 4; i < argc && n < 64; i++) grids[n++] = (unsigned)strtoul(argv[i], NULL, 10);
        return cmd_launch(atof(argv[2]), argv[3], grids, n);
    }
    if (!strcmp(cmd, "spawn") && argc >= 4) return cmd_spawn(atoi(argv[2]), after_dashes(argc, argv, 3));
    if (!strcmp(cmd, "storm") && argc >= 6)
        return cmd_storm(atoi(argv[2]), atoi(argv[3]), atol(argv[4]), after_dashes(argc, argv, 5));
    if (!strcmp(cmd, "bench") && argc >= 4) return cmd_bench(argv[2], atol(argv[3]));
    fprintf(stderr, "client: unknown or incomplete command %s\n", cmd);
    return 2;
}
