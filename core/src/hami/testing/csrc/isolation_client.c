/*
 * isolation_client.c: main and the scenarios of isolation_client.h that every vendor's client shares: memory limits
 * (init, stress), crashes (hold, churn, storm), start-up (spawn) and the benchmark loop (bench). The vendor's
 * client.c supplies the API calls.
 */
#define _GNU_SOURCE
#include "isolation_client.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void client_die(const char *what, int result) {
    fprintf(stderr, "client: %s returned %d\n", what, result);
    exit(3);
}

void client_check(const char *what, int result) {
    if (result != 0) client_die(what, result);
}

double client_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

uint64_t client_random(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return *state * 2685821657736338717ull;
}

/* ---- allocations through every counted API --------------------------------------------------------------- */

struct held {
    int kind;
    uint64_t handle;
};

struct stress_args {
    long ops;
    size_t max;
    uint64_t seed;
    long ok, oom;
};

static void *stress_thread(void *arg) {
    struct stress_args *s = arg;
    client_use_device();
    void *context = client_stress_begin();
    struct held held[8];
    int count = 0;
    uint64_t state = s->seed | 1;
    for (long i = 0; i < s->ops; i++) {
        uint64_t x = client_random(&state);
        if (count < 8 && (count == 0 || x % 10 < 6)) {
            size_t bytes = 1 + (size_t)(client_random(&state) % s->max);
            int kind = (int)(client_random(&state) % (uint64_t)client_kinds);
            int r = client_allocate(kind, bytes, context, &held[count].handle);
            held[count].kind = kind;
            if (r == 0) {
                count++;
                s->ok++;
            } else if (r == client_out_of_memory) {
                s->oom++;
            } else {
                client_die("allocation", r);
            }
        } else {
            int k = (int)(client_random(&state) % (uint64_t)count);
            client_release(held[k].kind, held[k].handle);
            held[k] = held[--count];
        }
    }
    while (count) {
        count--;
        client_release(held[count].kind, held[count].handle);
    }
    client_stress_end(context);
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

/* ---- a tenant zeroing the accounting file ------------------------------------------------------------------ */

/* Allocates `first` bytes (none when 0), overwrites `file` (the container's accounting file, which every process of
 * the container can write) with zeros, all of it (`whole`) or only device 0's memory counts (the header's and every
 * slot's, LAYOUT.md: a file that still looks well-formed), then allocates `second` bytes: prints what each
 * returned. */
static int cmd_tamper(size_t first, const char *file, size_t second, int whole) {
    client_use_device();
    uint64_t p = 0, q = 0;
    int r1 = first ? client_alloc(&p, first) : 0;
    int fd = open(file, O_WRONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        fprintf(stderr, "client: cannot open %s to zero it\n", file);
        return 4;
    }
    static char zeros[65536];
    for (off_t at = 8192 + 64; !whole && at < st.st_size; at += 1024) /* every slot's device 0 memory_used */
        if (pwrite(fd, zeros, 8, at) != 8) return 4;
    if (!whole && pwrite(fd, zeros, 8, 1024) != 8) return 4; /* the header's device 0 memory_used */
    for (off_t at = 0; whole && at < st.st_size; at += (off_t)sizeof zeros) {
        size_t n = (size_t)(st.st_size - at) < sizeof zeros ? (size_t)(st.st_size - at) : sizeof zeros;
        if (pwrite(fd, zeros, n, at) != (ssize_t)n) {
            fprintf(stderr, "client: cannot zero %s\n", file);
            return 4;
        }
    }
    close(fd);
    int r2 = client_alloc(&q, second);
    printf("{\"first\": %d, \"second\": %d, \"out_of_memory\": %d}\n", r1, r2, client_out_of_memory);
    return 0;
}

/* ---- limits and crashes ---------------------------------------------------------------------------------- */

static int cmd_init(size_t limit, int whole) {
    client_use_device();
    uint64_t p, q;
    if (limit) {
        int r = client_alloc(&q, limit + 1);
        if (r != client_out_of_memory) {
            fprintf(stderr, "client: one byte over the limit was not refused: %d\n", r);
            return 4;
        }
    }
    if (limit && whole) {
        int r = client_alloc(&p, limit);
        if (r != 0) {
            fprintf(stderr, "client: the whole limit (%zu bytes) was refused: %d\n", limit, r);
            return 4;
        }
        r = client_alloc(&q, 1);
        if (r != client_out_of_memory) {
            fprintf(stderr, "client: one byte more than the limit was not refused: %d\n", r);
            return 4;
        }
        client_free(p);
    }
    client_check("allocation", client_alloc(&p, 1));
    client_free(p);
    return 0;
}

__attribute__((noreturn)) static void cmd_hold(size_t bytes, int pieces) {
    client_use_device();
    for (int i = 0; i < pieces; i++) {
        uint64_t p;
        size_t piece = bytes / (size_t)pieces + (i == 0 ? bytes % (size_t)pieces : 0);
        client_check("allocation", client_alloc(&p, piece));
    }
    printf("held\n");
    fflush(stdout);
    for (;;) pause();
}

__attribute__((noreturn)) static void cmd_churn(size_t max) {
    client_use_device();
    uint64_t state = (uint64_t)getpid() * 2654435761u + 1;
    uint64_t held[4] = {0};
    for (;;) {
        int k = (int)(client_random(&state) % 4);
        if (held[k]) {
            client_free(held[k]);
            held[k] = 0;
        } else {
            int r = client_alloc(&held[k], 1 + (size_t)(client_random(&state) % max));
            if (r != 0 && r != client_out_of_memory) client_die("allocation", r);
            if (r != 0) held[k] = 0;
        }
    }
}

/* ---- many processes -------------------------------------------------------------------------------------- */

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
    double t0 = client_now_s();
    for (int i = 0; i < n; i++) pids[i] = start(argv);
    int ok = 0, failed = 0;
    for (int i = 0; i < n; i++) {
        int status;
        if (waitpid(pids[i], &status, 0) == pids[i] && WIFEXITED(status) && WEXITSTATUS(status) == 0) ok++;
        else failed++;
    }
    printf("{\"ok\": %d, \"failed\": %d, \"seconds\": %.4f}\n", ok, failed, client_now_s() - t0);
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
                running[i].kill_at = client_now_s() + (double)(client_random(&state) % (uint64_t)(max_us + 1)) / 1e6;
                started++;
                alive++;
            }
            if (running[i].pid && client_now_s() >= running[i].kill_at) {
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

/* ---- benchmark ------------------------------------------------------------------------------------------- */

static int cmd_bench(const char *what, long n) {
    client_use_device();
    client_bench_round(what, n / 10 + 1); /* warm up: caches, estimates, the first timed launch */
    double best = 1e18;
    for (int round = 0; round < 7; round++) {
        double ns = client_bench_round(what, n);
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
        fprintf(stderr, "usage: client init|stress|hold|churn|launch|spawn|storm|bench|tamper ...\n");
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
        uint32_t blocks[64];
        int n = 0;
        for (int i = 4; i < argc && n < 64; i++) blocks[n++] = (uint32_t)strtoul(argv[i], NULL, 10);
        return client_launch(atof(argv[2]), argv[3], blocks, n);
    }
    if (!strcmp(cmd, "spawn") && argc >= 4) return cmd_spawn(atoi(argv[2]), after_dashes(argc, argv, 3));
    if (!strcmp(cmd, "storm") && argc >= 6)
        return cmd_storm(atoi(argv[2]), atoi(argv[3]), atol(argv[4]), after_dashes(argc, argv, 5));
    if (!strcmp(cmd, "bench") && argc >= 4) return cmd_bench(argv[2], atol(argv[3]));
    if (!strcmp(cmd, "tamper") && argc >= 6)
        return cmd_tamper(strtoull(argv[2], NULL, 10), argv[3], strtoull(argv[4], NULL, 10), !strcmp(argv[5], "whole"));
    fprintf(stderr, "client: unknown or incomplete command %s\n", cmd);
    return 2;
}
