/*
 * fake_processes.h: the process table a vendor's fake management library answers its per-process call from (the
 * node-side backstop's tests, hami.testing.backstop). The file an environment variable names is read at every call
 * (a test appends to it as it starts processes), one process a line:
 *     <device index> <pid> <device memory in bytes>
 * the device index being the fake's own enumeration order. Each fake converts the bytes into its call's unit.
 */
#ifndef HAMI_FAKE_PROCESSES_H
#define HAMI_FAKE_PROCESSES_H

#include <stdio.h>
#include <stdlib.h>

struct fake_process {
    unsigned pid;
    unsigned long long bytes;
};

/* The processes on device `device`: up to `room` of them into `out` (which may be NULL when `room` is 0); returns
 * how many there are (more than `room` when `out` is too small), 0 when `variable` is unset, -1 when the file it
 * names cannot be read. */
static inline int fake_processes(const char *variable, int device, struct fake_process *out, int room) {
    const char *path = getenv(variable);
    if (!path || !*path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int found = 0;
    char line[128];
    while (fgets(line, sizeof line, f)) {
        int index;
        unsigned pid;
        unsigned long long bytes;
        if (sscanf(line, "%d %u %llu", &index, &pid, &bytes) != 3 || index != device) continue;
        if (out && found < room) {
            out[found].pid = pid;
            out[found].bytes = bytes;
        }
        found++;
    }
    fclose(f);
    return found;
}

#endif
