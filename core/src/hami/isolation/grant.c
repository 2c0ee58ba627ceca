/*
 * grant.c: the container's grant, the limits the node daemon decided at Allocate (hami.isolation.grant writes
 * it; GRANT.md documents the format). It is read before the environment at every process start, and the
 * environment may only lower what it grants: a process cannot lift its limits by starting a child with other
 * variables.
 *
 * Where: <dir>/<vendor>.grant, <dir> being HAMI_ISO_GRANT_DIR (/etc/hami/grant), a directory the node daemon
 * mounts read-only into every container it gives a library to. While that directory exists a grant is
 * expected: a missing, unreadable or malformed file fails closed (every device memory allocation is refused,
 * one line on stderr says why), never "no limit". The tenant cannot make the directory disappear: it is a
 * read-only mount point (rmdir fails, and unmounting needs privileges the container lacks). Only where it does
 * not exist (outside Kubernetes, or a node daemon older than the grant) is HAMI_ISOLATION_GRANT_DIR consulted
 * (tests use it), and without any grant the environment alone configures the library, as in HAMi.
 *
 * The same directory, and no other, holds the node daemon's map of the container's device processes to their
 * host pids (<dir>/pids, GRANT.md): hami_iso_host_pid() looks this process up there. A map from anywhere the
 * container can write could name another process's host pid as this one's.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define GRANT_MAX_BYTES 8192

static int is_directory(const char *path) {
    struct stat st;
    return path && *path && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The next whitespace-separated word of *cursor (NUL-terminated in place), NULL at the end of the line. */
static char *word(char **cursor) {
    char *s = *cursor;
    while (*s == ' ' || *s == '\t') s++;
    if (!*s) return NULL;
    char *start = s;
    while (*s && *s != ' ' && *s != '\t') s++;
    if (*s) *s++ = 0;
    *cursor = s;
    return start;
}

static int number(const char *text, uint64_t high, uint64_t *out) {
    if (!text || !isdigit((unsigned char)*text)) return -1;
    uint64_t value = 0;
    for (; isdigit((unsigned char)*text); text++) {
        unsigned digit = (unsigned)(*text - '0');
        if (value > (UINT64_MAX - digit) / 10) return -1;
        value = value * 10 + digit;
    }
    if (*text || value > high) return -1;
    *out = value;
    return 0;
}

/* Parse `text` (NUL-terminated, modified in place) into `grant`. 0, or -1 with `why` filled. */
int hami_grant_parse(char *text, struct hami_grant *grant, char *why, size_t size) {
    memset(grant, 0, sizeof *grant);
    grant->priority = 1;
    int line_number = 0, seen_header = 0, seen_end = 0;
    char *line = text;
    while (line && *line) {
        char *next = strchr(line, '\n');
        if (next) *next++ = 0;
        line_number++;
        char *cursor = line, *key = word(&cursor);
        if (!key || *key == '#') {
            line = next;
            continue;
        }
        if (seen_end) {
            snprintf(why, size, "line %d: text after 'end'", line_number);
            return -1;
        }
        uint64_t a, b, c;
        char *v1 = word(&cursor), *v2 = word(&cursor), *v3 = word(&cursor), *v4 = word(&cursor);
        char *extra = word(&cursor);
        if (!seen_header) {
            if (strcmp(key, "hami-grant") || !v1 || strcmp(v1, "1") || v2) {
                snprintf(why, size, "line %d: not 'hami-grant 1' (a grant of another version or no grant)",
                         line_number);
                return -1;
            }
            seen_header = 1;
        } else if (!strcmp(key, "policy") && v1 && !v2) {
            if (!strcmp(v1, "default")) grant->policy = HAMI_POLICY_DEFAULT;
            else if (!strcmp(v1, "force")) grant->policy = HAMI_POLICY_FORCE;
            else if (!strcmp(v1, "disable")) grant->policy = HAMI_POLICY_DISABLE;
            else goto bad;
        } else if (!strcmp(key, "priority") && v1 && !v2 && number(v1, 1000, &a) == 0) {
            grant->priority = (int)a;
        } else if (!strcmp(key, "oversubscribe") && v1 && !v2 && number(v1, 1, &a) == 0) {
            grant->oversubscribe = (int)a;
        } else if (!strcmp(key, "context") && v1 && !v2 && number(v1, UINT64_MAX, &a) == 0) {
            grant->context_bytes = a;
        } else if (!strcmp(key, "device") && v3 && !extra && number(v1, HAMI_ISO_MAX_DEVICES - 1, &a) == 0 &&
                   number(v2, UINT64_MAX, &b) == 0 && number(v3, 100, &c) == 0) {
            if ((int)a != grant->devices) {
                snprintf(why, size, "line %d: device %llu where device %d was due (devices are listed in order)",
                         line_number, (unsigned long long)a, grant->devices);
                return -1;
            }
            grant->memory_limit[a] = b;
            grant->core_limit[a] = (int)c;
            if (v4 && strlen(v4) < sizeof grant->uuid[a]) memcpy(grant->uuid[a], v4, strlen(v4) + 1);
            else if (v4) goto bad;
            grant->devices++;
        } else if (!strcmp(key, "end") && !v1) {
            seen_end = 1;
        } else {
            goto bad;
        }
        line = next;
        continue;
    bad:
        snprintf(why, size, "line %d: '%s' is not a grant line (GRANT.md)", line_number, key);
        return -1;
    }
    if (!seen_header || !seen_end || !grant->devices) {
        snprintf(why, size, "%s", !seen_header ? "empty" : !grant->devices ? "no device" : "incomplete (no 'end' line)");
        return -1;
    }
    return 0;
}

static char g_grant_dir[400];

struct hami_control *hami_grant_control(const hami_iso_vendor *vendor) {
    if (!g_grant_dir[0]) return NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/%s.control", g_grant_dir, vendor->name ? vendor->name : "isolation");
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return NULL;
    size_t size = HAMI_ISO_MAX_DEVICES * sizeof(struct hami_control);
    struct stat st;
    void *map = fstat(fd, &st) == 0 && (size_t)st.st_size >= size
                    ? mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0)
                    : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED) {
        HAMI_LOG(HAMI_LOG_WARN, "%s is not a control file: the node daemon cannot lift or pause this container", path);
        return NULL;
    }
    return map;
}

int hami_grant_load(const hami_iso_vendor *vendor, struct hami_grant *grant, char *why, size_t size) {
    const char *dir = HAMI_ISO_GRANT_DIR;
    if (!is_directory(dir)) {
        dir = getenv("HAMI_ISOLATION_GRANT_DIR");
        if (!is_directory(dir)) return 0; /* no grant is expected */
    }
    snprintf(g_grant_dir, sizeof g_grant_dir, "%s", dir);
    char path[512];
    snprintf(path, sizeof path, "%s/%s.grant", dir, vendor->name ? vendor->name : "isolation");
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        snprintf(why, size, "%s: %s", path, strerror(errno));
        return -1;
    }
    char text[GRANT_MAX_BYTES + 1];
    size_t length = 0;
    for (;;) {
        ssize_t n = read(fd, text + length, sizeof text - 1 - length);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        length += (size_t)n;
        if (length == sizeof text - 1) break;
    }
    close(fd);
    text[length] = 0;
    if (length >= GRANT_MAX_BYTES || memchr(text, 0, length)) {
        snprintf(why, size, "%s: not a grant (too long, or binary)", path);
        return -1;
    }
    char reason[200];
    if (hami_grant_parse(text, grant, reason, sizeof reason) != 0) {
        snprintf(why, size, "%s: %s", path, reason);
        return -1;
    }
    return 1;
}

/* ---- this process's host pid (<grant dir>/pids) ----------------------------------------------------------- */

#define PIDS_CHECK_NS 50000000ull /* look at the file at most this often */

static pthread_mutex_t g_pids_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    unsigned long long checked_ns; /* CLOCK_MONOTONIC of the last look; 0: never */
    dev_t dev;                     /* the file last read: a rename gives another inode */
    ino_t ino;
    off_t size;
    struct timespec mtime;
    pid_t pid;          /* the process the answer is about (a forked child asks afresh) */
    unsigned host_pid;  /* 0: not listed */
} g_pids;

static unsigned long long monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

/* The inode of this process's pid namespace (/proc/self/ns/pid reads "pid:[<inode>]"), 0 when unknown. */
static unsigned long long own_pid_namespace(void) {
    char link[64];
    ssize_t n = readlink("/proc/self/ns/pid", link, sizeof link - 1);
    if (n <= 0) return 0;
    link[n] = 0;
    unsigned long long inode = 0;
    return sscanf(link, "pid:[%llu]", &inode) == 1 ? inode : 0;
}

/* The host pid the map at `fd` gives (pid, namespace), 0 when it lists none. */
static unsigned find_host_pid(int fd, pid_t pid, unsigned long long namespace) {
    FILE *file = fdopen(fd, "r");
    if (!file) {
        close(fd);
        return 0;
    }
    char line[128];
    unsigned found = 0;
    while (!found && fgets(line, sizeof line, file)) {
        unsigned long inner = 0, host = 0;
        unsigned long long ns = 0;
        char extra;
        if (sscanf(line, "%lu %lu %llu %c", &inner, &host, &ns, &extra) != 3) continue; /* not a map line */
        if (inner == (unsigned long)pid && ns == namespace && host > 0 && host <= 0xffffffffu) found = (unsigned)host;
    }
    fclose(file);
    return found;
}

int hami_iso_host_pid(unsigned *host_pid) {
    if (!g_grant_dir[0]) return 0; /* no grant directory: nowhere a map can be trusted */
    pid_t pid = getpid();
    unsigned long long now = monotonic_ns();
    pthread_mutex_lock(&g_pids_lock);
    if (g_pids.pid != pid) { /* a forked child: its parent's answer is not its own */
        memset(&g_pids, 0, sizeof g_pids);
        g_pids.pid = pid;
    }
    if (!g_pids.checked_ns || now - g_pids.checked_ns >= PIDS_CHECK_NS) {
        g_pids.checked_ns = now;
        char path[512];
        snprintf(path, sizeof path, "%s/pids", g_grant_dir);
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            if (fd >= 0) close(fd);
            g_pids.ino = 0;
            g_pids.host_pid = 0;
        } else if (st.st_dev != g_pids.dev || st.st_ino != g_pids.ino || st.st_size != g_pids.size ||
                   st.st_mtim.tv_sec != g_pids.mtime.tv_sec || st.st_mtim.tv_nsec != g_pids.mtime.tv_nsec) {
            g_pids.dev = st.st_dev;
            g_pids.ino = st.st_ino;
            g_pids.size = st.st_size;
            g_pids.mtime = st.st_mtim;
            unsigned long long namespace = own_pid_namespace();
            g_pids.host_pid = namespace ? find_host_pid(fd, pid, namespace) : 0;
            if (!namespace) close(fd);
        } else {
            close(fd);
        }
    }
    unsigned found = g_pids.host_pid;
    pthread_mutex_unlock(&g_pids_lock);
    if (!found) return 0;
    *host_pid = found;
    return 1;
}

int hami_grant_container_host_pids(unsigned *out, int max, unsigned except) {
    if (!g_grant_dir[0] || max <= 0) return -1;
    char path[512];
    snprintf(path, sizeof path, "%s/pids", g_grant_dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return -1;
    struct stat st;
    FILE *file = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? fdopen(fd, "r") : NULL;
    if (!file) {
        close(fd);
        return -1;
    }
    char line[128];
    int n = 0;
    while (n < max && fgets(line, sizeof line, file)) {
        unsigned long inner = 0, host = 0;
        unsigned long long ns = 0;
        char extra;
        if (sscanf(line, "%lu %lu %llu %c", &inner, &host, &ns, &extra) != 3) continue; /* not a map line */
        if (host > 0 && host <= 0xffffffffu && (unsigned)host != except) out[n++] = (unsigned)host;
    }
    fclose(file);
    return n;
}
