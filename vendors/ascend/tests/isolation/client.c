/*
 * client.c: the C program the isolation tests and the benchmark drive. An ordinary Ascend program (linked against
 * libascendcl.so and libruntime.so, so its calls reach libvnpu.so's hooks when that is preloaded) using both
 * layers, as applications do (AscendCL directly, graph engines the runtime), with one subcommand per scenario:
 *
 *   init [LIMIT [whole]]          aclrtSetDevice(0), one small allocation; with LIMIT: LIMIT + 1 bytes must be
 *                                 refused with 207001; with "whole" all of LIMIT must be allocatable with rtMalloc,
 *                                 and one byte more refused (exit 4 otherwise)
 *   stress THREADS OPS MAX SEED   every thread allocates through every counted API of both layers and frees at
 *                                 random; prints {"ok": n, "oom": n}; exit 3 on any result but success or 207001
 *   hold BYTES PIECES             allocates and waits to be killed (prints "held")
 *   churn MAX                     allocates and frees forever (to be killed at a random point)
 *   launch SECONDS MODES BLOCKS... launches for SECONDS, cycling through MODES (a comma list of kernel, flag,
 *                                 handle, aicpu, model, acl, op, mdl; mixed = all of them) and BLOCKS
 *   spawn N -- ARGV...            starts N processes at once, waits; prints {"ok", "failed", "seconds"}
 *   storm N PARALLEL MAX_US -- ARGV...   starts N processes, PARALLEL at a time, SIGKILLs each after a random
 *                                 delay up to MAX_US; prints {"killed", "exited"}
 *   bench alloc|aclalloc|launch|meminfo N   nanoseconds per call (best of 7 rounds of N)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int32_t rtError_t;
typedef int aclError;

struct drv_mem_prop {
    uint32_t side, devid, module_id, pg_type, mem_type;
    uint64_t reserve;
};
struct acl_location {
    uint32_t id;
    int type;
};
struct acl_physical_prop {
    int handle_type, allocation_type, mem_attr;
    struct acl_location location;
    uint64_t reserve;
};

aclError aclrtSetDevice(int32_t device);
aclError aclrtMalloc(void **p, size_t size, int policy);
aclError aclrtMallocAlign32(void **p, size_t size, int policy);
aclError aclrtMallocCached(void **p, size_t size, int policy);
aclError aclrtFree(void *p);
aclError aclrtMallocPhysical(void **handle, size_t size, const struct acl_physical_prop *prop, uint64_t flags);
aclError aclrtFreePhysical(void *handle);
aclError aclrtGetMemInfo(int attr, size_t *free, size_t *total);
aclError aclrtSynchronizeDevice(void);
aclError aclrtLaunchKernel(void *func, uint32_t blocks, const void *args, size_t size, void *stream);
aclError aclopExecuteV2(const char *op, int n_in, void *in_desc[], void *in[], int n_out, void *out_desc[],
                        void *out[], void *attr, void *stream);
aclError aclmdlExecuteAsync(uint32_t model, const void *input, void *output, void *stream);
rtError_t rtMalloc(void **p, uint64_t size, uint32_t type, uint16_t module);
rtError_t rtFree(void *p);
rtError_t rtMallocPhysical(void **handle, size_t size, struct drv_mem_prop *prop, uint64_t flags);
rtError_t rtFreePhysical(void *handle);
rtError_t rtMemGetInfoEx(int kind, size_t *free, size_t *total);
rtError_t rtKernelLaunch(const void *stub, uint32_t blocks, void *args, uint32_t size, void *sm, void *stream);
rtError_t rtKernelLaunchWithFlagV2(const void *stub, uint32_t blocks, void *args, void *sm, void *stream,
                                   uint32_t flags, const void *cfg);
rtError_t rtKernelLaunchWithHandleV2(void *handle, uint64_t tiling, uint32_t blocks, void *args, void *sm,
                                     void *stream, const void *cfg);
rtError_t rtAicpuKernelLaunchExWithArgs(uint32_t type, const char *name, uint32_t blocks, const void *args, void *sm,
                                        void *stream, uint32_t flags);
rtError_t rtModelExecute(void *model, void *stream, uint32_t flag);

enum { OK = 0, OOM = 207001, HBM = 2 };

static void die(const char *what, int r) {
    fprintf(stderr, "client: %s returned %d\n", what, r);
    exit(3);
}

static void check(const char *what, int r) {
    if (r != OK) die(what, r);
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

enum { A_RT, A_RT_PHYSICAL, A_ACL, A_ACL_ALIGN32, A_ACL_CACHED, A_ACL_PHYSICAL, A_KINDS };

struct held {
    int kind;
    void *handle;
};

static int allocate(int kind, size_t bytes, struct held *h) {
    h->kind = kind;
    h->handle = NULL;
    switch (kind) {
    case A_RT: return rtMalloc(&h->handle, bytes, HBM, 0);
    case A_RT_PHYSICAL: {
        struct drv_mem_prop prop = {1, 0, 0, 0, 0, 0};
        return rtMallocPhysical(&h->handle, bytes, &prop, 0);
    }
    case A_ACL: return aclrtMalloc(&h->handle, bytes, 0);
    case A_ACL_ALIGN32: return aclrtMallocAlign32(&h->handle, bytes, 0);
    case A_ACL_CACHED: return aclrtMallocCached(&h->handle, bytes, 0);
    default: {
        struct acl_physical_prop prop = {0, 0, 0, {0, 1}, 0};
        return aclrtMallocPhysical(&h->handle, bytes, &prop, 0);
    }
    }
}

static void release(struct held *h) {
    switch (h->kind) {
    case A_RT: check("rtFree", rtFree(h->handle)); break;
    case A_RT_PHYSICAL: check("rtFreePhysical", rtFreePhysical(h->handle)); break;
    case A_ACL_PHYSICAL: check("aclrtFreePhysical", aclrtFreePhysical(h->handle)); break;
    default: check("aclrtFree", aclrtFree(h->handle)); break;
    }
}

struct stress_args {
    long ops;
    size_t max;
    uint64_t seed;
    long ok, oom;
};

static void *stress_thread(void *arg) {
    struct stress_args *s = arg;
    check("aclrtSetDevice", aclrtSetDevice(0));
    struct held held[8];
    int count = 0;
    uint64_t state = s->seed | 1;
    for (long i = 0; i < s->ops; i++) {
        uint64_t x = rnd(&state);
        if (count < 8 && (count == 0 || x % 10 < 6)) {
            size_t bytes = 1 + (size_t)(rnd(&state) % s->max);
            int kind = (int)(rnd(&state) % A_KINDS);
            int r = allocate(kind, bytes, &held[count]);
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
    check("aclrtSetDevice", aclrtSetDevice(0));
    void *p, *q;
    if (limit) {
        int r = rtMalloc(&q, limit + 1, HBM, 0);
        if (r != OOM) {
            fprintf(stderr, "client: one byte over the limit was not refused: %d\n", r);
            return 4;
        }
    }
    if (limit && whole) {
        int r = rtMalloc(&p, limit, HBM, 0);
        if (r != OK) {
            fprintf(stderr, "client: the whole limit (%zu bytes) was refused: %d\n", limit, r);
            return 4;
        }
        r = rtMalloc(&q, 1, HBM, 0);
        if (r != OOM) {
            fprintf(stderr, "client: one byte more than the limit was not refused: %d\n", r);
            return 4;
        }
        check("rtFree", rtFree(p));
    }
    check("rtMalloc", rtMalloc(&p, 1, HBM, 0));
    check("rtFree", rtFree(p));
    return 0;
}

__attribute__((noreturn)) static void cmd_hold(size_t bytes, int pieces) {
    check("aclrtSetDevice", aclrtSetDevice(0));
    for (int i = 0; i < pieces; i++) {
        void *p;
        size_t piece = bytes / (size_t)pieces + (i == 0 ? bytes % (size_t)pieces : 0);
        check("rtMalloc", rtMalloc(&p, piece, HBM, 0));
    }
    printf("held\n");
    fflush(stdout);
    for (;;) pause();
}

__attribute__((noreturn)) static void cmd_churn(size_t max) {
    check("aclrtSetDevice", aclrtSetDevice(0));
    uint64_t state = (uint64_t)getpid() * 2654435761u + 1;
    void *held[4] = {0};
    for (;;) {
        int k = (int)(rnd(&state) % 4);
        if (held[k]) {
            check("rtFree", rtFree(held[k]));
            held[k] = NULL;
        } else {
            int r = rtMalloc(&held[k], 1 + (size_t)(rnd(&state) % max), HBM, 0);
            if (r != OK && r != OOM) die("rtMalloc", r);
            if (r != OK) held[k] = NULL;
        }
    }
}

static const char *const MODES[] = {"kernel", "flag", "handle", "aicpu", "model", "acl", "op", "mdl"};
#define N_MODES (sizeof MODES / sizeof *MODES)

static int launch(const char *mode, void *kernel, uint32_t blocks) {
    if (!strcmp(mode, "kernel")) return rtKernelLaunch(kernel, blocks, NULL, 0, NULL, NULL);
    if (!strcmp(mode, "flag")) return rtKernelLaunchWithFlagV2(kernel, blocks, NULL, NULL, NULL, 0, NULL);
    if (!strcmp(mode, "handle")) return rtKernelLaunchWithHandleV2(kernel, 7, blocks, NULL, NULL, NULL, NULL);
    if (!strcmp(mode, "aicpu")) return rtAicpuKernelLaunchExWithArgs(1, "fake_aicpu_op", blocks, NULL, NULL, NULL, 0);
    if (!strcmp(mode, "model")) return rtModelExecute(kernel, NULL, 0);
    if (!strcmp(mode, "acl")) return aclrtLaunchKernel(kernel, blocks, NULL, 0, NULL);
    if (!strcmp(mode, "op")) return aclopExecuteV2("FakeOp", 0, NULL, NULL, 0, NULL, NULL, NULL, NULL);
    if (!strcmp(mode, "mdl")) return aclmdlExecuteAsync((uint32_t)(uintptr_t)kernel, NULL, NULL, NULL);
    return -1;
}

static int cmd_launch(double seconds, const char *mode, uint32_t *grids, int ngrids) {
    check("aclrtSetDevice", aclrtSetDevice(0));
    const char *modes[N_MODES];
    size_t nmodes = 0;
    char *list = strdup(strcmp(mode, "mixed") ? mode : "kernel,flag,handle,aicpu,model,acl,op,mdl");
    for (char *save = NULL, *m = strtok_r(list, ",", &save); m && nmodes < N_MODES; m = strtok_r(NULL, ",", &save))
        modes[nmodes++] = m;
    void *kernels[4] = {(void *)0x1000, (void *)0x2000, (void *)0x3000, (void *)0x4000};
    long launches = 0;
    double end = now_s() + seconds;
    while (now_s() < end) {
        for (int i = 0; i < 16; i++, launches++) {
            const char *m = modes[launches % (long)nmodes];
            int r = launch(m, kernels[launches % ngrids % 4], grids[launches % ngrids]);
            if (r != OK) die(m, r);
        }
    }
    aclrtSynchronizeDevice();
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
    void *p;
    size_t free, total;
    double t0 = now_s();
    if (!strcmp(what, "alloc")) {
        for (long i = 0; i < n; i++) {
            if (rtMalloc(&p, 1 << 20, HBM, 0) != OK) die("rtMalloc", 1);
            rtFree(p);
        }
    } else if (!strcmp(what, "aclalloc")) {
        for (long i = 0; i < n; i++) {
            if (aclrtMalloc(&p, 1 << 20, 0) != OK) die("aclrtMalloc", 1);
            aclrtFree(p);
        }
    } else if (!strcmp(what, "launch")) {
        for (long i = 0; i < n; i++) rtKernelLaunch((void *)0x1000, 1, NULL, 0, NULL, NULL);
    } else {
        for (long i = 0; i < n; i++) rtMemGetInfoEx(1, &free, &total);
    }
    return (now_s() - t0) / (double)n * 1e9;
}

static int cmd_bench(const char *what, long n) {
    check("aclrtSetDevice", aclrtSetDevice(0));
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
        uint32_t grids[64];
        int n = 0;
        for (int i = 4; i < argc && n < 64; i++) grids[n++] = (uint32_t)strtoul(argv[i], NULL, 10);
        return cmd_launch(atof(argv[2]), argv[3], grids, n);
    }
    if (!strcmp(cmd, "spawn") && argc >= 4) return cmd_spawn(atoi(argv[2]), after_dashes(argc, argv, 3));
    if (!strcmp(cmd, "storm") && argc >= 6)
        return cmd_storm(atoi(argv[2]), atoi(argv[3]), atol(argv[4]), after_dashes(argc, argv, 5));
    if (!strcmp(cmd, "bench") && argc >= 4) return cmd_bench(argv[2], atol(argv[3]));
    fprintf(stderr, "client: unknown or incomplete command %s\n", cmd);
    return 2;
}
