/*
 * interposer.c: libinterposer.so, a preloaded library that wraps hami_probe the usual way (dlsym(RTLD_NEXT, ...)),
 * for the RTLD_NEXT check of test_lookup.py: it must reach libinterposed.so's definition, not itself.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
int hami_probe(void) {
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "hami_probe");
    return next ? 100 + next() : -1;
}
