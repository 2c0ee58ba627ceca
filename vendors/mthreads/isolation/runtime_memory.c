/*
 * runtime_memory.c: the MUSA runtime's device memory, checked before it is allocated and counted exactly once, with
 * the core's building blocks (hookkit.c): every allocating call reserves its size first (over the limit:
 * musaErrorMemoryAllocation; the runtime is never asked), gives the reservation back when the runtime failed, and
 * remembers the size under the pointer; every free forgets it and releases exactly that size after the runtime freed.
 * musaMallocPitch is reserved with each row rounded up to 512 bytes and corrected to the pitch the runtime chose.
 * Managed memory counts as device memory. musaMemGetInfo answers the container's view of the current device.
 * Calls from inside the runtime pass straight through (runtime.c).
 */
#define _GNU_SOURCE
#include "vmusa.h"

#define PITCH_ALIGNMENT 512u
#define OWNER_OF(device) ((uint64_t)(device) + 1u)
#define FROM_RUNTIME() hami_musa_from_runtime(__builtin_return_address(0))

/* A pointer allocation of `size` bytes on the current device around `call`. */
#define COUNTED_ALLOC(name, ptr, size, call)                                                                   \
    HAMI_MUSA_ENTER(name);                                                                                     \
    if (!(ptr) || FROM_RUNTIME()) return hami_musa.call;                                                       \
    int device = hami_musa_device();                                                                           \
    uint64_t bytes = (uint64_t)(size);                                                                         \
    if (hami_iso_memory_reserve(device, bytes) != 0) return musaErrorMemoryAllocation;                         \
    musaError_t r = hami_musa.call;                                                                            \
    if (r != musaSuccess) {                                                                                    \
        hami_iso_memory_release(device, bytes);                                                                \
        return r;                                                                                              \
    }                                                                                                          \
    hami_iso_remember(HAMI_ISO_POINTER, (uint64_t)(uintptr_t) * (ptr), device, bytes, OWNER_OF(device));       \
    return r;

HAMI_EXPORT musaError_t musaMalloc(void **devPtr, size_t size) {
    COUNTED_ALLOC(musaMalloc, devPtr, size, musaMalloc(devPtr, size))
}

HAMI_EXPORT musaError_t musaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
    COUNTED_ALLOC(musaMallocManaged, devPtr, size, musaMallocManaged(devPtr, size, flags))
}

HAMI_EXPORT musaError_t musaMallocAsync(void **devPtr, size_t size, musaStream_t stream) {
    COUNTED_ALLOC(musaMallocAsync, devPtr, size, musaMallocAsync(devPtr, size, stream))
}

HAMI_EXPORT musaError_t musaMallocFromPoolAsync(void **ptr, size_t size, musaMemPool_t pool, musaStream_t stream) {
    COUNTED_ALLOC(musaMallocFromPoolAsync, ptr, size, musaMallocFromPoolAsync(ptr, size, pool, stream))
}

HAMI_EXPORT musaError_t musaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
    HAMI_MUSA_ENTER(musaMallocPitch);
    if (!devPtr || !pitch || FROM_RUNTIME()) return hami_musa.musaMallocPitch(devPtr, pitch, width, height);
    int device = hami_musa_device();
    uint64_t row = ((uint64_t)width + PITCH_ALIGNMENT - 1) / PITCH_ALIGNMENT * PITCH_ALIGNMENT, bound;
    if (row < width || __builtin_mul_overflow(row, (uint64_t)height, &bound)) bound = UINT64_MAX;
    if (hami_iso_memory_reserve(device, bound) != 0) return musaErrorMemoryAllocation;
    musaError_t r = hami_musa.musaMallocPitch(devPtr, pitch, width, height);
    if (r != musaSuccess) {
        hami_iso_memory_release(device, bound);
        return r;
    }
    uint64_t exact = (uint64_t)*pitch * (uint64_t)height;
    if (exact < bound) {
        hami_iso_memory_release(device, bound - exact);
    } else if (exact > bound && hami_iso_memory_reserve(device, exact - bound) != 0) {
        hami_musa.musaFree(*devPtr);
        hami_iso_memory_release(device, bound);
        *devPtr = NULL;
        return musaErrorMemoryAllocation;
    }
    hami_iso_remember(HAMI_ISO_POINTER, (uint64_t)(uintptr_t)*devPtr, device, exact, OWNER_OF(device));
    return r;
}

#define COUNTED_FREE(name, ptr, call)                                                                          \
    HAMI_MUSA_ENTER(name);                                                                                     \
    if (!(ptr) || FROM_RUNTIME()) return hami_musa.call;                                                       \
    hami_iso_allocation a;                                                                                     \
    uint64_t key = (uint64_t)(uintptr_t)(ptr);                                                                 \
    int known = hami_iso_untrack(HAMI_ISO_POINTER, key, &a);                                                   \
    musaError_t r = hami_musa.call;                                                                            \
    hami_iso_forgotten(HAMI_ISO_POINTER, key, known, &a, r == musaSuccess);                                    \
    return r;

HAMI_EXPORT musaError_t musaFree(void *devPtr) { COUNTED_FREE(musaFree, devPtr, musaFree(devPtr)) }

HAMI_EXPORT musaError_t musaFreeAsync(void *devPtr, musaStream_t stream) {
    COUNTED_FREE(musaFreeAsync, devPtr, musaFreeAsync(devPtr, stream))
}

HAMI_EXPORT musaError_t musaMemGetInfo(size_t *free, size_t *total) {
    HAMI_MUSA_ENTER(musaMemGetInfo);
    musaError_t r = hami_musa.musaMemGetInfo(free, total);
    if (r == musaSuccess && free && total) hami_iso_memory_view_sizes(hami_musa_device(), free, total);
    return r;
}
