/*
 * lookup.c: the dynamic linker's other ways to a function, closed for every vendor library.
 *
 * A vendor library hooks its API by exporting functions of the same names (preloaded, they come first in the
 * global scope). That leaves the linker's other doors, which this file defines for every vendor library, for the
 * vendor's version script to export (`dlsym; dlvsym; dlopen; dlmopen;`); the vendor registers its hook table, by
 * name, with hami_iso_hook_for_symbol():
 *
 *   - dlsym(handle, name): a hooked name (or dlsym, dlvsym, dlopen, dlmopen) answers the hook wherever the real
 *     dlsym finds that name in `handle` (a runtime opened privately with RTLD_LOCAL included; NULL where the real
 *     one answers NULL); every other name, RTLD_NEXT included, goes to the real dlsym by a tail call, so the
 *     caller is still the caller;
 *   - dlvsym(handle, name, version): any version string of dlsym, dlvsym or dlmopen answers ours, and a hooked
 *     name (hami_iso_hook_for_symbol) answers its hook, whatever the version;
 *   - dlopen(file, flags | RTLD_DEEPBIND): loaded without RTLD_DEEPBIND, so the library's references (to dlsym,
 *     or straight to the driver it links) go through the global scope, where the hooks are;
 *   - dlmopen(LM_ID_NEWLM or another namespace, ...): refused (NULL, dlerror() says why): a new namespace would
 *     load the driver without the hooks. dlmopen(LM_ID_BASE, ...) is dlopen.
 *
 * The real functions are found in libc's own symbol table (its default versions), never through dlsym or
 * dlvsym, which are ours. hami_iso_real_dlsym() is the real dlsym for the library's own lookups (resolving the
 * real functions it wraps): a plain dlsym call inside the library binds to the one below and answers hooks.
 *
 * What remains, and is the node daemon's backstop to catch: a static binary, or one that makes system calls
 * to the device itself (no dynamic linker to interpose), a process that rewrites its own memory, or one that
 * escapes the preload (its own mount namespace or chroot without /etc/ld.so.preload).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <string.h>

#include "internal.h"

/* ---- libc's own symbols --------------------------------------------------------------------------------- */

struct libc_search {
    const char *name;
    void *found;
};

static uint32_t gnu_hash_symbols(const uint32_t *table) {
    uint32_t buckets = table[0], offset = table[1], bloom = table[2];
    const uint32_t *bucket = table + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
    const uint32_t *chain = bucket + buckets;
    uint32_t last = 0;
    for (uint32_t i = 0; i < buckets; i++)
        if (bucket[i] > last) last = bucket[i];
    if (last < offset) return offset;
    while (!(chain[last - offset] & 1)) last++;
    return last + 1;
}

static int search_object(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct libc_search *search = data;
    const char *base = strrchr(info->dlpi_name ? info->dlpi_name : "", '/');
    base = base ? base + 1 : info->dlpi_name;
    if (!base || strncmp(base, "libc.so.", 8)) return 0;
    const ElfW(Dyn) *dynamic = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dynamic = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (!dynamic) return 0;
    const ElfW(Sym) *symbols = NULL;
    const char *strings = NULL;
    const uint32_t *gnu_hash = NULL, *hash = NULL;
    const ElfW(Half) *versions = NULL;
    for (const ElfW(Dyn) *d = dynamic; d->d_tag != DT_NULL; d++) {
        ElfW(Addr) p = d->d_un.d_ptr;
        if (p && p < info->dlpi_addr) p += info->dlpi_addr; /* not relocated in place */
        if (d->d_tag == DT_SYMTAB) symbols = (const ElfW(Sym) *)p;
        else if (d->d_tag == DT_STRTAB) strings = (const char *)p;
        else if (d->d_tag == DT_GNU_HASH) gnu_hash = (const uint32_t *)p;
        else if (d->d_tag == DT_HASH) hash = (const uint32_t *)p;
        else if (d->d_tag == DT_VERSYM) versions = (const ElfW(Half) *)p;
    }
    if (!symbols || !strings || (!gnu_hash && !hash)) return 0;
    uint32_t count = hash ? hash[1] : gnu_hash_symbols(gnu_hash);
    for (uint32_t i = 1; i < count; i++) {
        const ElfW(Sym) *s = &symbols[i];
        if (s->st_shndx == SHN_UNDEF || ELF64_ST_TYPE(s->st_info) != STT_FUNC) continue;
        if (versions && (versions[i] & 0x8000)) continue; /* a hidden (older) version */
        if (!strcmp(strings + s->st_name, search->name)) {
            search->found = (void *)(info->dlpi_addr + s->st_value);
            return 1;
        }
    }
    return 0;
}

void *hami_iso_libc_symbol(const char *name) {
    struct libc_search search = {name, NULL};
    dl_iterate_phdr(search_object, &search);
    return search.found;
}

/* ---- the real functions, found once ----------------------------------------------------------------------- */

typedef void *(*dlvsym_fn)(void *, const char *, const char *);
typedef void *(*dlopen_fn)(const char *, int);
typedef void *(*dlmopen_fn)(Lmid_t, const char *, int);

static void *g_real[4];
enum { REAL_DLVSYM, REAL_DLOPEN, REAL_DLMOPEN, REAL_DLSYM };
static const char *const g_real_names[] = {"dlvsym", "dlopen", "dlmopen", "dlsym"};

static void *real(int which) {
    void *f = __atomic_load_n(&g_real[which], __ATOMIC_ACQUIRE);
    if (HAMI_LIKELY(f != NULL)) return f;
    f = hami_iso_libc_symbol(g_real_names[which]);
    if (f) __atomic_store_n(&g_real[which], f, __ATOMIC_RELEASE);
    else hami_log(HAMI_LOG_ERROR, "libc's %s was not found: the call fails", g_real_names[which]);
    return f;
}

hami_iso_dlsym_fn hami_iso_real_dlsym(void) { return (hami_iso_dlsym_fn)real(REAL_DLSYM); }

/* ---- the doors ---------------------------------------------------------------------------------------------- */

__attribute__((weak)) void *hami_iso_hook_for_symbol(const char *name);

void *hami_iso_lookup_hook(const char *name) {
    if (!name) return NULL;
    if (name[0] == 'd' && name[1] == 'l') {
        if (!strcmp(name, "dlsym")) return (void *)&dlsym;
        if (!strcmp(name, "dlvsym")) return (void *)&dlvsym;
        if (!strcmp(name, "dlopen")) return (void *)&dlopen;
        if (!strcmp(name, "dlmopen")) return (void *)&dlmopen;
    }
    return hami_iso_hook_for_symbol ? hami_iso_hook_for_symbol(name) : NULL;
}

__attribute__((visibility("default"))) void *dlsym(void *handle, const char *name) {
    hami_iso_dlsym_fn lookup = hami_iso_real_dlsym();
    if (HAMI_UNLIKELY(!lookup)) return NULL;
    void *hook = hami_iso_lookup_hook(name);
    if (hook) return lookup(handle, name) ? hook : NULL;
    return lookup(handle, name); /* a tail call: RTLD_NEXT still means "after the caller" */
}

__attribute__((visibility("default"))) void *dlvsym(void *handle, const char *name, const char *version) {
    void *hook = hami_iso_lookup_hook(name);
    if (hook) return hook;
    dlvsym_fn f = (dlvsym_fn)real(REAL_DLVSYM);
    return f ? f(handle, name, version) : NULL;
}

__attribute__((visibility("default"))) void *dlopen(const char *file, int flags) {
    dlopen_fn f = (dlopen_fn)real(REAL_DLOPEN);
    if (HAMI_UNLIKELY(flags & RTLD_DEEPBIND)) {
        HAMI_LOG(HAMI_LOG_INFO, "dlopen(%s) without RTLD_DEEPBIND: its references must reach the hooks",
                 file ? file : "NULL");
        flags &= ~RTLD_DEEPBIND;
    }
    return f ? f(file, flags) : NULL; /* a tail call: the dynamic linker still sees the caller's return address */
}

__attribute__((visibility("default"))) void *dlmopen(Lmid_t namespace_id, const char *file, int flags) {
    if (namespace_id == LM_ID_BASE) return dlopen(file, flags);
    hami_log(HAMI_LOG_ERROR, "dlmopen(%s) into another link-map namespace refused: there the device library "
             "would run without isolation", file ? file : "NULL");
    dlopen_fn f = (dlopen_fn)real(REAL_DLOPEN);
    /* leaves dlerror() saying why: the message is the name of a file that cannot exist */
    if (f) (void)f("/hami: dlmopen into a new namespace is refused by the isolation library", RTLD_NOW | RTLD_NOLOAD);
    return NULL;
}
