/*
 * isolation_client.h: the client program that a vendor's isolation tests and benchmark drive, split into what
 * every vendor shares (isolation_client.c: main, the scenarios, the helpers below) and what a vendor's client.c
 * defines with its own API (the client_* functions declared first). The two are compiled together; the program is
 * an ordinary application of the vendor's API, linked against its (fake) libraries, so that a preloaded isolation
 * library sees its calls. Subcommands:
 *
 *   init [LIMIT [whole]]          device 0 made current, one small allocation; with LIMIT: LIMIT + 1 bytes must be
 *                                 refused as out of memory; with "whole" also all of LIMIT must be allocatable, and
 *                                 one byte more refused (exit 4 otherwise)
 *   stress THREADS OPS MAX SEED   every thread allocates through every counted API (client_allocate's kinds) and
 *                                 frees at random; prints {"ok": n, "oom": n}; exit 3 on any result but success or
 *                                 out of memory
 *   hold BYTES PIECES             allocates and waits to be killed (prints "held")
 *   churn MAX                     allocates and frees forever (to be killed at a random point)
 *   launch SECONDS MODE GRID...   the vendor's client_launch: launches for SECONDS; prints {"launches": n}
 *   spawn N -- ARGV...            starts N processes at once, waits; prints {"ok", "failed", "seconds"}
 *   storm N PARALLEL MAX_US -- ARGV...   starts N processes, PARALLEL at a time, SIGKILLs each after a random
 *                                 delay up to MAX_US; prints {"killed", "exited"}
 *   bench WHAT N                  nanoseconds per call of the vendor's client_bench_round (best of 7 rounds of N)
 *
 * A failed call the scenario did not expect exits 3 with the call's name and result on stderr.
 */
#ifndef HAMI_ISOLATION_CLIENT_H
#define HAMI_ISOLATION_CLIENT_H

#include <stddef.h>
#include <stdint.h>

/* ---- what a vendor's client defines ----------------------------------------------------------------------- */

extern const int client_out_of_memory; /* the API's result for "out of device memory" */
extern const int client_kinds;         /* how many allocation kinds client_allocate has */

/* Make device 0 current for the calling thread (initializing the API on the first call); exit 3 on failure. */
void client_use_device(void);

/* The plain device allocation of `bytes` (its address in *p) and its free; the API's result. */
int client_alloc(uint64_t *p, size_t bytes);
void client_free(uint64_t p);

/* One stress thread's setup after client_use_device (what client_allocate needs, e.g. a pool), and its teardown. */
void *client_stress_begin(void);
void client_stress_end(void *context);

/* An allocation of kind 0 .. client_kinds - 1 of about `bytes`; its handle in *handle; the API's result. */
int client_allocate(int kind, size_t bytes, void *context, uint64_t *handle);
void client_release(int kind, uint64_t handle);

/* The launch subcommand: launch for `seconds`, as `mode` says, cycling through the `n` block counts. */
int client_launch(double seconds, const char *mode, uint32_t *blocks, int n);

/* One benchmark round: `n` calls of what `what` names; nanoseconds per call. */
double client_bench_round(const char *what, long n);

/* ---- what isolation_client.c gives it -------------------------------------------------------------------- */

__attribute__((noreturn)) void client_die(const char *what, int result); /* exit 3, naming the call */
void client_check(const char *what, int result);                         /* client_die unless result is 0 */
double client_now_s(void);                                               /* CLOCK_MONOTONIC seconds */
uint64_t client_random(uint64_t *state);                                 /* xorshift64* */

#endif
