/* vendor_hooks.c: the scratch vendor's own hook, musaMalloc: counted with the core, the real one found through
 * hami_cu_real_symbol() (the real dlsym: dlsym itself is the layer's and would answer this hook). */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "hami_cuda.h"

HAMI_EXPORT int musaMalloc(void **pointer, size_t bytes) {
    if (!hami_cu_cuda()) return 3;
    typedef int (*malloc_fn)(void **, size_t);
    malloc_fn real = (malloc_fn)hami_cu_real_symbol(RTLD_NEXT, "musaMalloc");
    if (!real) return 500;
    if (hami_iso_memory_reserve(0, bytes) != 0) return 2;
    int r = real(pointer, bytes);
    if (r != 0) hami_iso_memory_release(0, bytes);
    return r;
}
