/*
 * config.c: limits and settings from the environment, read at every process start (never frozen in the
 * accounting file). HAMi's names, given by the vendor: <memory>[_<i>] in bytes or with a k/m/g suffix,
 * <core>[_<i>] in percent, the priority, the utilization policy, oversubscription and the log level.
 * A per-device variable (suffix _<i>, i the visible device index) wins over the variable without suffix.
 * A value that cannot be read is reported and ignored (no limit), never fatal.
 *
 * When the node daemon wrote a grant (grant.c) it is the configuration, and the environment may only lower it:
 * a smaller memory or compute limit (a limit where the grant has none: the whole device), a larger priority
 * number (lower priority), the policy "force". Oversubscription, "disable" and a higher priority come from the
 * grant alone; an unset, zero or unreadable variable leaves the grant's limit. A grant that is expected but
 * cannot be read fails closed (hami_process.fail_closed).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

int hami_parse_size(const char *text, uint64_t *bytes) {
    if (!text) return -1;
    while (isspace((unsigned char)*text)) text++;
    if (!isdigit((unsigned char)*text)) return -1;
    uint64_t value = 0;
    for (; isdigit((unsigned char)*text); text++) {
        unsigned digit = (unsigned)(*text - '0');
        if (value > (UINT64_MAX - digit) / 10) return -1;
        value = value * 10 + digit;
    }
    uint64_t unit = 1;
    switch (*text) {
    case 'k': case 'K': unit = 1ull << 10; text++; break;
    case 'm': case 'M': unit = 1ull << 20; text++; break;
    case 'g': case 'G': unit = 1ull << 30; text++; break;
    case 't': case 'T': unit = 1ull << 40; text++; break;
    default: break;
    }
    if (unit > 1 && (*text == 'i' || *text == 'I')) text++;
    if (unit > 1 && (*text == 'b' || *text == 'B')) text++;
    while (isspace((unsigned char)*text)) text++;
    if (*text) return -1;
    if (value && unit > UINT64_MAX / value) return -1;
    *bytes = value * unit;
    return 0;
}

/* The value of `name`_<device>, else of `name`; NULL when neither is set. */
const char *hami_env_device(const char *name, int device, char *buffer, size_t size) {
    if (!name) return NULL;
    snprintf(buffer, size, "%s_%d", name, device);
    const char *value = getenv(buffer);
    if (value && *value) return value;
    value = getenv(name);
    return (value && *value) ? value : NULL;
}

static int parse_int(const char *text, long low, long high, long *out) {
    char *end = NULL;
    long value = strtol(text, &end, 10);
    while (end && isspace((unsigned char)*end)) end++;
    if (end == text || (end && *end) || value < low || value > high) return -1;
    *out = value;
    return 0;
}

static int truthy(const char *text) {
    return text && (!strcasecmp(text, "true") || !strcmp(text, "1") || !strcasecmp(text, "yes") ||
                    !strcasecmp(text, "on"));
}

/* The smaller of two limits where 0 means none. */
static uint64_t lower(uint64_t granted, uint64_t asked) {
    if (!granted) return asked;
    return asked && asked < granted ? asked : granted;
}

static void apply_grant(const hami_iso_vendor *vendor, struct hami_process *proc) {
    struct hami_grant grant;
    char why[700];
    int found = hami_grant_load(vendor, &grant, why, sizeof why);
    if (found == 0) return;
    if (found < 0) {
        proc->fail_closed = 1;
        hami_log(HAMI_LOG_ERROR, "no readable grant where the node daemon puts one (%s): every device memory "
                 "allocation is refused; recreate the pod, or ask the node's administrator", why);
        return;
    }
    proc->granted = 1;
    proc->oversubscribe = grant.oversubscribe;
    if (proc->context_bytes < grant.context_bytes) proc->context_bytes = grant.context_bytes; /* env only raises */
    int asked_policy = proc->policy;
    proc->policy = grant.policy;
    if (asked_policy == HAMI_POLICY_FORCE && grant.policy == HAMI_POLICY_DEFAULT) proc->policy = HAMI_POLICY_FORCE;
    if (proc->priority < grant.priority) proc->priority = grant.priority;
    for (int i = 0; i < HAMI_ISO_MAX_DEVICES; i++) {
        struct hami_process_device *device = &proc->devices[i];
        if (i >= grant.devices) { /* not granted: the runtime shows the container none */
            device->memory_limit = 0;
            device->core_limit = 0;
            continue;
        }
        int granted_core = grant.core_limit[i] >= 100 ? 0 : grant.core_limit[i];
        device->memory_limit = lower(grant.memory_limit[i], device->memory_limit);
        device->core_limit = (int)lower((uint64_t)granted_core, (uint64_t)device->core_limit);
    }
}

void hami_config_read(const hami_iso_vendor *vendor, struct hami_process *proc) {
    char name[160];
    long number;

    const char *level = vendor->log_level_env ? getenv(vendor->log_level_env) : NULL;
    if (level && *level) {
        if (parse_int(level, 0, 100, &number) == 0)
            hami_log_level = number > HAMI_LOG_TRACE ? HAMI_LOG_TRACE : (int)number;
        else
            HAMI_LOG(HAMI_LOG_WARN, "%s=%s is not a level 0-4; keeping %d", vendor->log_level_env, level,
                     hami_log_level);
    }

    proc->policy = HAMI_POLICY_DEFAULT;
    const char *policy = vendor->policy_env ? getenv(vendor->policy_env) : NULL;
    if (policy && *policy) {
        if (!strcasecmp(policy, "force"))
            proc->policy = HAMI_POLICY_FORCE;
        else if (!strcasecmp(policy, "disable"))
            proc->policy = HAMI_POLICY_DISABLE;
        else if (strcasecmp(policy, "default"))
            HAMI_LOG(HAMI_LOG_WARN, "%s=%s is not default, force or disable; using default", vendor->policy_env,
                     policy);
    }

    proc->priority = 1;
    const char *priority = vendor->priority_env ? getenv(vendor->priority_env) : NULL;
    if (priority && *priority) {
        if (parse_int(priority, 0, 1000, &number) == 0)
            proc->priority = (int)number;
        else
            HAMI_LOG(HAMI_LOG_WARN, "%s=%s is not a priority (0 high, 1 normal); using 1", vendor->priority_env,
                     priority);
    }

    proc->oversubscribe = vendor->oversubscribe_env ? truthy(getenv(vendor->oversubscribe_env)) : 0;

    /* What the driver reserves per process and device for a context, counted against the limit (GRANT.md's
     * `context`): the environment may only raise the grant's figure, so it can only cost the container. */
    proc->context_bytes = 0;
    const char *context = getenv("HAMI_ISOLATION_CONTEXT_MEMORY");
    if (context && *context && hami_parse_size(context, &proc->context_bytes) != 0) {
        HAMI_LOG(HAMI_LOG_WARN, "HAMI_ISOLATION_CONTEXT_MEMORY=%s is not a size (like 300m): ignored", context);
        proc->context_bytes = 0;
    }

    const char *hold = getenv("HAMI_ISOLATION_TEST_LOCK_HOLD_US");
    if (hold && parse_int(hold, 0, 10000000, &number) == 0) proc->test_lock_hold_us = (uint32_t)number;

    for (int i = 0; i < HAMI_ISO_MAX_DEVICES; i++) {
        struct hami_process_device *device = &proc->devices[i];
        device->memory_limit = 0;
        const char *memory = hami_env_device(vendor->memory_limit_env, i, name, sizeof name);
        if (memory) {
            uint64_t bytes;
            if (hami_parse_size(memory, &bytes) == 0)
                device->memory_limit = bytes;
            else
                HAMI_LOG(HAMI_LOG_ERROR, "memory limit '%s' of device %d is not a size (like 3000m): no limit",
                         memory, i);
        }
        device->core_limit = 0;
        const char *core = hami_env_device(vendor->core_limit_env, i, name, sizeof name);
        if (core) {
            if (parse_int(core, 0, 1000000, &number) == 0)
                device->core_limit = number >= 100 ? 0 : (int)number;
            else
                HAMI_LOG(HAMI_LOG_ERROR, "compute limit '%s' of device %d is not a percentage: no limit", core, i);
        }
    }
    apply_grant(vendor, proc);
    for (int i = 0; i < HAMI_ISO_MAX_DEVICES; i++) {
        struct hami_process_device *device = &proc->devices[i];
        device->limited = device->core_limit > 0 && proc->policy != HAMI_POLICY_DISABLE;
        /* The bucket holds at most 50 ms of wall time at the limit's rate: enough to absorb sampling jitter,
         * too little to matter for a share measured over seconds. */
        device->burst_ns = (int64_t)device->core_limit * 500000;
    }
}
