/* deep.c: libdeep.so, a library an application loads with RTLD_DEEPBIND, whose own references to dlsym would
 * then bind to libc's before the preloaded library's (the escape hami.testing.isolation.LookupTests tries). */
#define _GNU_SOURCE
#include <dlfcn.h>
void *deep_lookup(void *handle, const char *name) { return dlsym(handle, name); }
