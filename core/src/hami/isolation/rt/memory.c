/*
 * memory.c: device memory, checked before it is allocated and counted exactly once.
 *
 * Every allocating call (Malloc, MallocManaged, MallocAsync, MallocFromPoolAsync, MallocPitch, ExtMallocWithFlags,
 * MemCreate) reserves its size with the core first (over the limit: the runtime's out-of-memory code, 2; the
 * runtime is never asked), calls the real function, gives the reservation back if that failed, and remembers the
 * size under the pointer (or the physical handle of MemCreate). Every freeing call (Free, FreeAsync, MemRelease)
 * forgets it, frees, and releases exactly that size after the real free succeeded. MallocPitch is reserved with
 * each row rounded up to 4 KiB (above any pitch alignment a runtime reports) and corrected to pitch x height once
 * the runtime chose the pitch (refused, and freed again, should a pitch be larger). Managed memory is counted as
 * device memory (it can all be resident). Calls from inside the runtime pass straight through (runtime.c).
 *
 * The queries answer with the container's view of the current device: total = min(limit, physical), free =
 * min(limit - used, physical free), never below zero; the physical numbers without a limit; the limit even above
 * the physical size when oversubscription is allowed. MemGetInfo gets the view whoever calls it (applying it twice
 * changes nothing), DeviceTotalMem answers the limit of the device asked about.
 */
#define _GNU_SOURCE
#include "hami_rt.h"

#define PITCH_BOUND 4096u
#define OWNER_OF(device) ((uint64_t)(device) + 1u)
#define FROM_RUNTIME() hami_rt_from_runtime(__builtin_return_address(0))

static inline void remember(uint32_t kind, uint64_t key, int device, uint64_t size) {
    hami_iso_remember(kind, key, device, size, OWNER_OF(device));
}

/* A pointer allocation of `size` bytes on the current device around `call`. */
#define COUNTED_ALLOC(name, ptr, size, call)                                                                   \
    HAMI_RT_ENTER(name);                                                                                       \
    if (!(ptr) || FROM_RUNTIME()) return hami_rt_fn.call;                                                       \
    int device = hami_rt_device();                                                                             \
    uint64_t bytes = (uint64_t)(size);                                                                         \
    if (hami_iso_memory_reserve(device, bytes) != 0) return HAMI_RT_ERROR_OUT_OF_MEMORY;                       \
    hami_rt_error r = hami_rt_fn.call;                                                                          \
    if (r != HAMI_RT_SUCCESS) {                                                                                \
        hami_iso_memory_release(device, bytes);                                                                \
        return r;                                                                                              \
    }                                                                                                          \
    remember(HAMI_ISO_POINTER, (uint64_t)(uintptr_t) * (ptr), device, bytes);                                  \
    return r;

/* A free of what `key` names around `call`. */
#define COUNTED_FREE(name, kind, key, skip, call)                                                              \
    HAMI_RT_ENTER(name);                                                                                       \
    if ((skip) || FROM_RUNTIME()) return hami_rt_fn.call;                                                       \
    hami_iso_allocation a;                                                                                     \
    int known = hami_iso_untrack((kind), (key), &a);                                                           \
    hami_rt_error r = hami_rt_fn.call;                                                                          \
    hami_iso_forgotten((kind), (key), known, &a, r == HAMI_RT_SUCCESS);                                        \
    return r;

HAMI_EXPORT hami_rt_error HAMI_RT(Malloc)(void **ptr, size_t size) { COUNTED_ALLOC(Malloc, ptr, size, Malloc(ptr, size)) }

HAMI_EXPORT hami_rt_error HAMI_RT(MallocManaged)(void **dev_ptr, size_t size, unsigned int flags) {
    COUNTED_ALLOC(MallocManaged, dev_ptr, size, MallocManaged(dev_ptr, size, flags))
}

HAMI_EXPORT hami_rt_error HAMI_RT(MallocAsync)(void **dev_ptr, size_t size, hami_rt_stream stream) {
    COUNTED_ALLOC(MallocAsync, dev_ptr, size, MallocAsync(dev_ptr, size, stream))
}

#if defined(HAMI_RT_HAS_POOL) && HAMI_RT_HAS_POOL
HAMI_EXPORT hami_rt_error HAMI_RT(MallocFromPoolAsync)(void **dev_ptr, size_t size, void *pool, hami_rt_stream stream) {
    COUNTED_ALLOC(MallocFromPoolAsync, dev_ptr, size, MallocFromPoolAsync(dev_ptr, size, pool, stream))
}
#endif

#if HAMI_RT_HAS_HIP_EXTRAS
HAMI_EXPORT hami_rt_error HAMI_RT(ExtMallocWithFlags)(void **ptr, size_t sizeBytes, unsigned int flags) {
    COUNTED_ALLOC(ExtMallocWithFlags, ptr, sizeBytes, ExtMallocWithFlags(ptr, sizeBytes, flags))
}
#endif

HAMI_EXPORT hami_rt_error HAMI_RT(MallocPitch)(void **ptr, size_t *pitch, size_t width, size_t height) {
    HAMI_RT_ENTER(MallocPitch);
    if (!ptr || !pitch || FROM_RUNTIME()) return hami_rt_fn.MallocPitch(ptr, pitch, width, height);
    int device = hami_rt_device();
    uint64_t bytes = (((uint64_t)width + PITCH_BOUND - 1) / PITCH_BOUND * PITCH_BOUND) * height;
    if (hami_iso_memory_reserve(device, bytes) != 0) return HAMI_RT_ERROR_OUT_OF_MEMORY;
    hami_rt_error r = hami_rt_fn.MallocPitch(ptr, pitch, width, height);
    if (r != HAMI_RT_SUCCESS) {
        hami_iso_memory_release(device, bytes);
        return r;
    }
    uint64_t real = (uint64_t)*pitch * height;
    if (real > bytes && hami_iso_memory_reserve(device, real - bytes) != 0) {
        hami_rt_fn.Free(*ptr);
        hami_iso_memory_release(device, bytes);
        *ptr = NULL;
        return HAMI_RT_ERROR_OUT_OF_MEMORY;
    }
    if (real < bytes) hami_iso_memory_release(device, bytes - real);
    remember(HAMI_ISO_POINTER, (uint64_t)(uintptr_t)*ptr, device, real);
    return r;
}

HAMI_EXPORT hami_rt_error HAMI_RT(Free)(void *ptr) {
    COUNTED_FREE(Free, HAMI_ISO_POINTER, (uint64_t)(uintptr_t)ptr, !ptr, Free(ptr))
}

HAMI_EXPORT hami_rt_error HAMI_RT(FreeAsync)(void *dev_ptr, hami_rt_stream stream) {
    COUNTED_FREE(FreeAsync, HAMI_ISO_POINTER, (uint64_t)(uintptr_t)dev_ptr, !dev_ptr, FreeAsync(dev_ptr, stream))
}

#if defined(HAMI_RT_HAS_VMM) && HAMI_RT_HAS_VMM
HAMI_EXPORT hami_rt_error HAMI_RT(MemCreate)(hami_rt_mem_handle *handle, size_t size, const hami_rt_mem_prop *prop,
                                             unsigned long long flags) {
    HAMI_RT_ENTER(MemCreate);
    if (!handle || !prop || prop->location.type != HAMI_RT_LOCATION_DEVICE || FROM_RUNTIME())
        return hami_rt_fn.MemCreate(handle, size, prop, flags);
    int device = prop->location.id;
    if (hami_iso_memory_reserve(device, size) != 0) return HAMI_RT_ERROR_OUT_OF_MEMORY;
    hami_rt_error r = hami_rt_fn.MemCreate(handle, size, prop, flags);
    if (r != HAMI_RT_SUCCESS) {
        hami_iso_memory_release(device, size);
        return r;
    }
    remember(HAMI_ISO_HANDLE, (uint64_t)*handle, device, size);
    return r;
}

HAMI_EXPORT hami_rt_error HAMI_RT(MemRelease)(hami_rt_mem_handle handle) {
    COUNTED_FREE(MemRelease, HAMI_ISO_HANDLE, (uint64_t)handle, 0, MemRelease(handle))
}
#endif

/* ---- queries -------------------------------------------------------------------------------------------- */

HAMI_EXPORT hami_rt_error HAMI_RT(MemGetInfo)(size_t *free, size_t *total) {
    HAMI_RT_ENTER(MemGetInfo);
    hami_rt_error r = hami_rt_fn.MemGetInfo(free, total);
    if (r == HAMI_RT_SUCCESS && free && total) hami_iso_memory_view_sizes(hami_rt_device(), free, total);
    return r;
}

#if defined(HAMI_RT_HAS_DEVICE_TOTAL_MEM) && HAMI_RT_HAS_DEVICE_TOTAL_MEM
HAMI_EXPORT hami_rt_error HAMI_RT(DeviceTotalMem)(size_t *bytes, int device) {
    HAMI_RT_ENTER(DeviceTotalMem);
    hami_rt_error r = hami_rt_fn.DeviceTotalMem(bytes, device);
    if (r == HAMI_RT_SUCCESS && bytes) hami_iso_memory_view_sizes(device, NULL, bytes);
    return r;
}
#endif
