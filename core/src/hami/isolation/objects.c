/*
 * objects.c: finding a vendor's real libraries and where they are mapped, for the vendors whose hooks resolve their
 * real functions themselves (hami_isolation.h, "The vendor's libraries"): the next definition of a name, else the
 * library opened by name; and the address range of a loaded object, which a hook compares its return address with
 * to pass the vendor library's calls to its own exported functions straight through (counted once).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>

#include "internal.h"

void *hami_iso_resolve(void **library, const char *const *names, size_t count, const char *name) {
    hami_iso_dlsym_fn lookup = hami_iso_real_dlsym(); /* not dlsym: in this library it answers the hooks */
    if (!lookup) return NULL;
    void *found = lookup(RTLD_NEXT, name);
    if (found) return found;
    for (size_t i = 0; !*library && i < count; i++) {
        *library = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
        if (!*library) *library = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    }
    return *library ? lookup(*library, name) : NULL;
}

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
