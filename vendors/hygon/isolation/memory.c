/*
 * memory.c: device memory, checked before it is allocated and counted exactly once.
 *
 * Every allocating call (hipMalloc, hipMallocManaged, hipMallocAsync, hipMallocFromPoolAsync, hipMallocPitch,
 * hipExtMallocWithFlags, hipMemCreate) reserves its size with the core first (over the limit: hipErrorOutOfMemory,
 * the runtime's own code; the runtime is never asked), calls the real function, gives the reservation back if
 * that failed, and remembers the size under the pointer (or the physical handle of hipMemCreate). Every freeing
 * call (hipFree, hipFreeAsync, hipMemRelease) forgets it, frees, and releases exactly that size after the real free
 * succeeded. hipMallocPitch is reserved with each row rounded up to 4 KiB (above any pitch alignment HIP reports) and
 * corrected to pitch x height once the runtime chose the pitch (refused, and freed again, should a pitch be larger). Managed memory is counted as device memory
 * (it can all be resident). Calls from inside the HIP runtime pass straight through (runtime.c).
 *
 * The queries answer with the container's view of the current device: total = min(limit, physical), free =
 * min(limit - used, physical free), never below zero; the physical numbers without a limit; the limit even above
 * the physical size with HIP_OVERSUBSCRIBE. hipMemGetInfo gets the view whoever calls it (applying it twice changes
 * nothing), hipDeviceTotalMem answers the limit of the device asked about.
 */
#define _GNU_SOURCE
#include "vdcu.h"

#define PITCH_BOUND 4096u
#define OWNER_OF(device) ((uint64_t)(device) + 1u)
#define FROM_HIP() hami_vdcu_from_hip(__builtin_return_address(0))

static inline void remember(uint32_t kind, uint64_t key, int device, uint64_t size) {
    hami_iso_remember(kind, key, device, size, OWNER_OF(device));
}

static inline void forgotten(uint32_t kind, uint64_t key, int known, const hami_iso_allocation *a, hipError_t r) {
    hami_iso_forgotten(kind, key, known, a, r == hipSuccess);
}

/* A pointer allocation of `size` bytes on the current device around `call`. */
#define COUNTED_ALLOC(name, ptr, size, call)                                                                   \
    HAMI_HIP_ENTER(name);                                                                                      \
    if (!(ptr) || FROM_HIP()) return hami_real.call;                                                           \
    int device = hami_vdcu_device();                                                                           \
    uint64_t bytes = (uint64_t)(size);                                                                         \
    if (hami_iso_memory_reserve(device, bytes) != 0) return hipErrorOutOfMemory;                               \
    hipError_t r = hami_real.call;                                                                             \
    if (r != hipSuccess) {                                                                                     \
        hami_iso_memory_release(device, bytes);                                                                \
        return r;                                                                                              \
    }                                                                                                          \
    remember(HAMI_ISO_POINTER, (uint64_t)(uintptr_t) * (ptr), device, bytes);                                  \
    return r;

HAMI_EXPORT hipError_t hipMalloc(void **ptr, size_t size) { COUNTED_ALLOC(hipMalloc, ptr, size, hipMalloc(ptr, size)) }

HAMI_EXPORT hipError_t hipMallocManaged(void **dev_ptr, size_t size, unsigned int flags) {
    COUNTED_ALLOC(hipMallocManaged, dev_ptr, size, hipMallocManaged(dev_ptr, size, flags))
}

HAMI_EXPORT hipError_t hipMallocAsync(void **dev_ptr, size_t size, hipStream_t stream) {
    COUNTED_ALLOC(hipMallocAsync, dev_ptr, size, hipMallocAsync(dev_ptr, size, stream))
}

HAMI_EXPORT hipError_t hipMallocFromPoolAsync(void **dev_ptr, size_t size, hipMemPool_t pool, hipStream_t stream) {
    COUNTED_ALLOC(hipMallocFromPoolAsync, dev_ptr, size, hipMallocFromPoolAsync(dev_ptr, size, pool, stream))
}

HAMI_EXPORT hipError_t hipExtMallocWithFlags(void **ptr, size_t sizeBytes, unsigned int flags) {
    COUNTED_ALLOC(hipExtMallocWithFlags, ptr, sizeBytes, hipExtMallocWithFlags(ptr, sizeBytes, flags))
}

HAMI_EXPORT hipError_t hipMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height) {
    HAMI_HIP_ENTER(hipMallocPitch);
    if (!ptr || !pitch || FROM_HIP()) return hami_real.hipMallocPitch(ptr, pitch, width, height);
    int device = hami_vdcu_device();
    uint64_t bytes = (((uint64_t)width + PITCH_BOUND - 1) / PITCH_BOUND * PITCH_BOUND) * height;
    if (hami_iso_memory_reserve(device, bytes) != 0) return hipErrorOutOfMemory;
    hipError_t r = hami_real.hipMallocPitch(ptr, pitch, width, height);
    if (r != hipSuccess) {
        hami_iso_memory_release(device, bytes);
        return r;
    }
    uint64_t real = (uint64_t)*pitch * height;
    if (real > bytes && hami_iso_memory_reserve(device, real - bytes) != 0) {
        hami_real.hipFree(*ptr);
        hami_iso_memory_release(device, bytes);
        *ptr = NULL;
        return hipErrorOutOfMemory;
    }
    if (real < bytes) hami_iso_memory_release(device, bytes - real);
    remember(HAMI_ISO_POINTER, (uint64_t)(uintptr_t)*ptr, device, real);
    return r;
}

HAMI_EXPORT hipError_t hipFree(void *ptr) {
    HAMI_HIP_ENTER(hipFree);
    if (!ptr || FROM_HIP()) return hami_real.hipFree(ptr);
    hami_iso_allocation a;
    uint64_t key = (uint64_t)(uintptr_t)ptr;
    int known = hami_iso_untrack(HAMI_ISO_POINTER, key, &a);
    hipError_t r = hami_real.hipFree(ptr);
    forgotten(HAMI_ISO_POINTER, key, known, &a, r);
    return r;
}

HAMI_EXPORT hipError_t hipFreeAsync(void *dev_ptr, hipStream_t stream) {
    HAMI_HIP_ENTER(hipFreeAsync);
    if (!dev_ptr || FROM_HIP()) return hami_real.hipFreeAsync(dev_ptr, stream);
    hami_iso_allocation a;
    uint64_t key = (uint64_t)(uintptr_t)dev_ptr;
    int known = hami_iso_untrack(HAMI_ISO_POINTER, key, &a);
    hipError_t r = hami_real.hipFreeAsync(dev_ptr, stream);
    forgotten(HAMI_ISO_POINTER, key, known, &a, r);
    return r;
}

HAMI_EXPORT hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size,
                                    const hipMemAllocationProp *prop, unsigned long long flags) {
    HAMI_HIP_ENTER(hipMemCreate);
    if (!handle || !prop || prop->location.type != hipMemLocationTypeDevice || FROM_HIP())
        return hami_real.hipMemCreate(handle, size, prop, flags);
    int device = prop->location.id;
    if (hami_iso_memory_reserve(device, size) != 0) return hipErrorOutOfMemory;
    hipError_t r = hami_real.hipMemCreate(handle, size, prop, flags);
    if (r != hipSuccess) {
        hami_iso_memory_release(device, size);
        return r;
    }
    remember(HAMI_ISO_HANDLE, (uint64_t)*handle, device, size);
    return r;
}

HAMI_EXPORT hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle) {
    HAMI_HIP_ENTER(hipMemRelease);
    if (FROM_HIP()) return hami_real.hipMemRelease(handle);
    hami_iso_allocation a;
    int known = hami_iso_untrack(HAMI_ISO_HANDLE, (uint64_t)handle, &a);
    hipError_t r = hami_real.hipMemRelease(handle);
    forgotten(HAMI_ISO_HANDLE, (uint64_t)handle, known, &a, r);
    return r;
}

/* ---- queries -------------------------------------------------------------------------------------------- */

HAMI_EXPORT hipError_t hipMemGetInfo(size_t *free, size_t *total) {
    HAMI_HIP_ENTER(hipMemGetInfo);
    hipError_t r = hami_real.hipMemGetInfo(free, total);
    if (r == hipSuccess && free && total) hami_iso_memory_view_sizes(hami_vdcu_device(), free, total);
    return r;
}

HAMI_EXPORT hipError_t hipDeviceTotalMem(size_t *bytes, hipDevice_t device) {
    HAMI_HIP_ENTER(hipDeviceTotalMem);
    hipError_t r = hami_real.hipDeviceTotalMem(bytes, device);
    if (r == hipSuccess && bytes) hami_iso_memory_view_sizes(device, NULL, bytes);
    return r;
}
