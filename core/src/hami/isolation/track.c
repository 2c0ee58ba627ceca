/*
 * track.c: what was counted for each live pointer or handle of this process, so that a free releases exactly
 * that. A hash table in 64 shards, each an open-addressing table with linear probing (no tombstones: removal
 * shifts the run back) behind its own spinlock; a pointer's shard comes from its hash, so threads working on
 * different allocations rarely meet. Insert, lookup and removal are O(1) and a few tens of nanoseconds.
 * Process-local: a forked child starts empty (it owns no device memory).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define SHARDS 64
#define INITIAL_CAPACITY 64

struct entry {
    uint64_t key; /* 0 = empty */
    uint64_t size;
    uint64_t owner;
    int32_t device;
    uint32_t kind;
};

struct shard {
    atomic_int lock;
    uint32_t capacity; /* a power of two, or 0 before the first insert */
    uint32_t count;
    struct entry *entries;
} __attribute__((aligned(64)));

static struct shard g_shards[SHARDS];

static inline uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Kinds live in separate key spaces: the top 3 bits (no pointer or handle of a 64-bit process uses them;
 * a handle that does is still kept apart by its stored kind). */
static inline uint64_t make_key(uint32_t kind, uint64_t value) { return value ^ ((uint64_t)kind << 61); }

static inline void shard_lock(struct shard *s) {
    for (int spins = 0;; spins++) {
        if (!atomic_exchange_explicit(&s->lock, 1, memory_order_acquire)) return;
        while (atomic_load_explicit(&s->lock, memory_order_relaxed)) {
            if (++spins > 256) {
                sched_yield();
                spins = 0;
            } else {
                hami_cpu_relax();
            }
        }
    }
}

static inline void shard_unlock(struct shard *s) { atomic_store_explicit(&s->lock, 0, memory_order_release); }

static int grow(struct shard *s) {
    uint32_t capacity = s->capacity ? s->capacity * 2 : INITIAL_CAPACITY;
    struct entry *entries = calloc(capacity, sizeof *entries);
    if (!entries) return -1;
    for (uint32_t i = 0; i < s->capacity; i++) {
        struct entry *e = &s->entries[i];
        if (!e->key) continue;
        uint32_t j = (uint32_t)(mix(e->key) >> 6) & (capacity - 1);
        while (entries[j].key) j = (j + 1) & (capacity - 1);
        entries[j] = *e;
    }
    free(s->entries);
    s->entries = entries;
    s->capacity = capacity;
    return 0;
}

int hami_iso_track(uint32_t kind, uint64_t value, const hami_iso_allocation *a) {
    uint64_t key = make_key(kind, value);
    if (!key) return -1;
    uint64_t h = mix(key);
    struct shard *s = &g_shards[h & (SHARDS - 1)];
    shard_lock(s);
    if ((s->count + 1) * 2 > s->capacity && grow(s) != 0) {
        shard_unlock(s);
        HAMI_LOG(HAMI_LOG_ERROR, "out of host memory tracking an allocation");
        return -1;
    }
    uint32_t mask = s->capacity - 1, i = (uint32_t)(h >> 6) & mask;
    while (s->entries[i].key && s->entries[i].key != key) i = (i + 1) & mask;
    if (!s->entries[i].key) s->count++;
    else HAMI_LOG(HAMI_LOG_WARN, "allocation %#llx tracked twice", (unsigned long long)value);
    s->entries[i] = (struct entry){key, a->size, a->owner, a->device, kind};
    shard_unlock(s);
    return 0;
}

/* Remove entry i of a linear-probing table, moving later members of its run back into the hole. */
static void remove_at(struct shard *s, uint32_t i) {
    uint32_t mask = s->capacity - 1, hole = i, j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!s->entries[j].key) break;
        uint32_t home = (uint32_t)(mix(s->entries[j].key) >> 6) & mask;
        /* j may move to the hole when its home is not in (hole, j] cyclically */
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            s->entries[hole] = s->entries[j];
            hole = j;
        }
    }
    s->entries[hole].key = 0;
    s->count--;
}

int hami_iso_untrack(uint32_t kind, uint64_t value, hami_iso_allocation *out) {
    uint64_t key = make_key(kind, value);
    if (!key) return 0;
    uint64_t h = mix(key);
    struct shard *s = &g_shards[h & (SHARDS - 1)];
    shard_lock(s);
    if (!s->capacity) {
        shard_unlock(s);
        return 0;
    }
    uint32_t mask = s->capacity - 1, i = (uint32_t)(h >> 6) & mask;
    while (s->entries[i].key && s->entries[i].key != key) i = (i + 1) & mask;
    if (!s->entries[i].key || s->entries[i].kind != kind) {
        shard_unlock(s);
        return 0;
    }
    struct entry e = s->entries[i];
    remove_at(s, i);
    shard_unlock(s);
    if (out) *out = (hami_iso_allocation){e.size, e.owner, e.device, e.kind};
    return 1;
}

size_t hami_iso_untrack_owner(uint64_t owner, uint32_t kind_mask) {
    size_t dropped = 0;
    uint64_t released[HAMI_ISO_MAX_DEVICES] = {0};
    for (int k = 0; k < SHARDS; k++) {
        struct shard *s = &g_shards[k];
        shard_lock(s);
        for (uint32_t i = 0; i < s->capacity;) {
            struct entry *e = &s->entries[i];
            if (e->key && e->owner == owner && (kind_mask & (1u << e->kind))) {
                if (e->device >= 0 && e->device < HAMI_ISO_MAX_DEVICES) released[e->device] += e->size;
                remove_at(s, i); /* something else may have moved into i: look at it again */
                dropped++;
                continue;
            }
            i++;
        }
        shard_unlock(s);
    }
    for (int d = 0; d < HAMI_ISO_MAX_DEVICES; d++)
        if (released[d]) hami_iso_memory_release(d, released[d]);
    return dropped;
}

void hami_track_reset(void) {
    for (int k = 0; k < SHARDS; k++) {
        struct shard *s = &g_shards[k];
        atomic_store_explicit(&s->lock, 0, memory_order_relaxed);
        free(s->entries);
        s->entries = NULL;
        s->capacity = 0;
        s->count = 0;
    }
}
