/*
 * log.c: one line per message on stderr, written with a single write(2) so that lines of concurrent threads
 * and processes never interleave. The level comes from the vendor's log level variable (LIBCUDA_LOG_LEVEL for
 * NVIDIA): 0 errors, 1 warnings (the default), 2 information, 3 debugging, 4 every hooked call.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

int hami_log_level = HAMI_LOG_WARN;

static const char *g_vendor = "isolation";

void hami_log_set_vendor(const char *name) {
    if (name && *name) g_vendor = name;
}

void hami_log(int level, const char *format, ...) {
    static const char *const names[] = {"ERROR", "WARN", "INFO", "DEBUG", "TRACE"};
    char line[1024];
    int saved = errno;
    const char *name = (level >= 0 && level <= HAMI_LOG_TRACE) ? names[level] : "LOG";
    int n = snprintf(line, sizeof line, "[hami %s %s pid=%d] ", g_vendor, name, (int)getpid());
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof line) n = (int)sizeof line - 1;
    va_list args;
    va_start(args, format);
    int m = vsnprintf(line + n, sizeof line - (size_t)n, format, args);
    va_end(args);
    size_t length = (size_t)n + (m > 0 ? (size_t)m : 0);
    if (length > sizeof line - 2) length = sizeof line - 2;
    line[length++] = '\n';
    ssize_t written = write(STDERR_FILENO, line, length);
    (void)written;
    errno = saved;
}
