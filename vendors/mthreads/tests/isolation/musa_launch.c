/*
 * musa_launch.c: a tenant's program for the launch tests, linked against libmusart.so as an application of the MUSA
 * runtime is: its musa* calls bind by name in the global scope, where a preloaded libvmusa.so comes first for the
 * names it exports, and only for those (a ctypes script looks its functions up through dlsym instead, which
 * libvmusa.so answers with its hooks whatever it exports, so it cannot tell a missing export). Written from
 * musa_runtime_api.h (CUDA's runtime under the musa prefix).
 *
 *   musa_launch SECONDS kernel|exc BLOCKS   launches of BLOCKS blocks for SECONDS, each through musaLaunchKernel
 *                                            (kernel) or musaLaunchKernelExC (exc); prints {"launches": n}; a failed
 *                                            call exits 3, naming it
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "musa_runtime_api.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void check(const char *what, musaError_t result) {
    if (result == musaSuccess) return;
    fprintf(stderr, "%s returned %d\n", what, (int)result);
    exit(3);
}

int main(int argc, char **argv) {
    if (argc != 4 || (strcmp(argv[2], "kernel") && strcmp(argv[2], "exc"))) {
        fprintf(stderr, "usage: %s SECONDS kernel|exc BLOCKS\n", argv[0]);
        return 2;
    }
    const int exc = !strcmp(argv[2], "exc");
    const dim3 grid = {(unsigned int)strtoul(argv[3], NULL, 10), 1, 1}, block = {64, 1, 1};
    const musaLaunchConfig_t config = {.gridDim = grid, .blockDim = block};
    const void *kernel = (const void *)0x1000;
    check("musaSetDevice", musaSetDevice(0));
    long launches = 0;
    const double end = now_s() + atof(argv[1]);
    while (now_s() < end) {
        for (int i = 0; i < 16; i++, launches++) {
            if (exc) check("musaLaunchKernelExC", musaLaunchKernelExC(&config, kernel, NULL));
            else check("musaLaunchKernel", musaLaunchKernel(kernel, grid, block, NULL, 0, NULL));
        }
    }
    check("musaDeviceSynchronize", musaDeviceSynchronize());
    printf("{\"launches\": %ld}\n", launches);
    return 0;
}
