/*
 * fake_readings.h: the figures a vendor's fake management library answers its device-reading calls from (the node
 * monitor's tests, hami.testing.readings). The file an environment variable names is read at every call (a test
 * rewrites it between scrapes), one device a line:
 *     <device index> <memory used, bytes> <busy, percent> <power, milliwatts> <temperature, degrees Celsius>
 * the device index being the fake's own enumeration order. A figure written "-" is one the library does not support
 * on that device (the fake answers with its "not supported" code; memory in use, which discovery's memory call also
 * answers, then reads as the fake's own figure, nothing in use); a device with no line, or no file, reads as all
 * "-". Each fake converts the figures into its call's units (KiB, 0.1 W, ...).
 */
#ifndef HAMI_FAKE_READINGS_H
#define HAMI_FAKE_READINGS_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fake_reading {
    long long memory_used; /* bytes */
    long long busy;        /* percent */
    long long power_mw;    /* milliwatts */
    long long celsius;     /* degrees Celsius */
};

/* A figure the library does not support (written "-"), in any field above. */
#define FAKE_UNSUPPORTED (LLONG_MIN / 2)

static inline long long fake_reading_figure(const char *word) {
    if (!strcmp(word, "-")) return FAKE_UNSUPPORTED;
    return strtoll(word, NULL, 10);
}

/* Device `device`'s figures into `out` (each FAKE_UNSUPPORTED when not given); returns 1 when the file has a line for
 * it, 0 when not (or `variable` is unset), -1 when the file it names cannot be read. */
static inline int fake_reading(const char *variable, int device, struct fake_reading *out) {
    out->memory_used = out->busy = out->power_mw = out->celsius = FAKE_UNSUPPORTED;
    const char *path = getenv(variable);
    if (!path || !*path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        int index;
        char used[32], busy[32], power[32], celsius[32];
        if (sscanf(line, "%d %31s %31s %31s %31s", &index, used, busy, power, celsius) != 5 || index != device)
            continue;
        out->memory_used = fake_reading_figure(used);
        out->busy = fake_reading_figure(busy);
        out->power_mw = fake_reading_figure(power);
        out->celsius = fake_reading_figure(celsius);
        found = 1;
    }
    fclose(f);
    return found;
}

#endif
