/*
 * objrange.c: where a loaded object lies in memory (hami_iso_object_range), for vendor hooks that tell a call from
 * inside their runtime (its return address within the runtime's range) from an application's.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>

#include "internal.h"

struct range_query {
    uintptr_t base, lo, hi;
};

static int find_range(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct range_query *q = data;
    if (info->dlpi_addr != q->base) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (!q->lo || lo < q->lo) q->lo = lo;
        if (hi > q->hi) q->hi = hi;
    }
    return 1;
}

void hami_iso_object_range(const void *probe, uintptr_t *lo, uintptr_t *hi) {
    Dl_info info;
    if (!probe || !dladdr(probe, &info) || !info.dli_fbase) return;
    struct range_query q = {(uintptr_t)info.dli_fbase, 0, 0};
    dl_iterate_phdr(find_range, &q);
    if (!q.hi) return;
    *lo = q.lo;
    *hi = q.hi;
}
