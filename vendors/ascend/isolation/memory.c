/*
 * memory.c: device memory, checked before it is allocated and counted exactly once.
 *
 * Every allocating call reserves its size with the core first (over the limit: ACL_ERROR_RT_MEMORY_ALLOCATION,
 * 207001, the runtime's own out-of-memory code; the runtime is never asked), calls the real function, gives the
 * reservation back if that failed, and remembers the size under the pointer (rtMalloc) or the physical handle
 * (rtMallocPhysical, the virtual-memory path of PyTorch's expandable segments). Every freeing call forgets it,
 * frees, and releases exactly that size after the real free succeeded. Host memory (rtMalloc's host types, a
 * physical allocation on the host side) is not device memory and passes.
 *
 * Counted once: AscendCL's allocation functions reach rtMalloc / rtMallocPhysical underneath on the versions this
 * library knows, with a size of their own (aclrtMalloc pads to 32 bytes plus 32). An AscendCL hook reserves its
 * estimate and leaves it in the thread's state; the runtime hook underneath takes the reservation over, corrects
 * it to the size it is really asked for, and remembers the allocation under the runtime's pointer. When no runtime
 * call happens underneath (another version), the AscendCL hook keeps its reservation and remembers the allocation
 * itself. Frees: whichever hook forgets the pointer first releases it, the other finds nothing.
 *
 * The queries answer with the container's view of the current device: total = min(limit, physical), free =
 * min(limit - used, physical free), never below zero; the physical numbers without a limit; the limit even above
 * the physical size with ASCEND_OVERSUBSCRIBE. Every memory kind (DDR, HBM, their huge/normal and P2P parts) is the
 * device's memory and gets the same treatment, and applying the view twice (aclrtGetMemInfo reaching
 * rtMemGetInfoEx) changes nothing.
 */
#define _GNU_SOURCE
#include "vnpu.h"

#define OWNER_OF(device) ((uint64_t)(device) + 1u)

static inline int reserve(int device, uint64_t bytes) { return hami_iso_memory_reserve(device, bytes); }

static inline void remember(uint32_t kind, uint64_t key, int device, uint64_t size) {
    hami_iso_remember(kind, key, device, size, OWNER_OF(device));
}

/* After the real free of (kind, key) answered: release what was counted, or keep counting if it failed. */
static inline void forgotten(uint32_t kind, uint64_t key, int known, const hami_iso_allocation *a, int r) {
    hami_iso_forgotten(kind, key, known, a, r == 0);
}

/* ---- the runtime layer --------------------------------------------------------------------------------- */

/* Reserve `size` bytes for a runtime allocation, taking over what an AscendCL hook above reserved for it.
 * Returns 0 with *device set, or -1 when over the limit (the AscendCL hook keeps its reservation then). */
static int reserve_runtime(int fallback_device, uint64_t size, int *device) {
    struct hami_vnpu_thread *t = &hami_vnpu_tls;
    if (t->pending && !t->pending_taken) {
        uint64_t have = t->pending_bytes;
        *device = t->pending_device;
        if (size > have && reserve(*device, size - have) != 0) return -1;
        if (size < have) hami_iso_memory_release(*device, have - size);
        t->pending_taken = 1;
        return 0;
    }
    *device = fallback_device;
    return reserve(*device, size);
}

HAMI_EXPORT rtError_t rtMalloc(void **devPtr, uint64_t size, rtMemType_t type, uint16_t moduleId) {
    HAMI_RT_ENTER(rtMalloc);
    if (!devPtr || (type & RT_MEMORY_HOST_BIT)) return hami_real.rtMalloc(devPtr, size, type, moduleId);
    int device;
    if (reserve_runtime(hami_vnpu_device(), size, &device) != 0) return ACL_ERROR_RT_MEMORY_ALLOCATION;
    rtError_t r = hami_real.rtMalloc(devPtr, size, type, moduleId);
    if (r != RT_ERROR_NONE) {
        hami_iso_memory_release(device, size);
        return r;
    }
    remember(HAMI_ISO_POINTER, (uint64_t)(uintptr_t)*devPtr, device, size);
    return r;
}

HAMI_EXPORT rtError_t rtFree(void *devPtr) {
    HAMI_RT_ENTER(rtFree);
    hami_iso_allocation a;
    uint64_t key = (uint64_t)(uintptr_t)devPtr;
    int known = hami_iso_untrack(HAMI_ISO_POINTER, key, &a);
    rtError_t r = hami_real.rtFree(devPtr);
    forgotten(HAMI_ISO_POINTER, key, known, &a, r);
    return r;
}

HAMI_EXPORT rtError_t rtMallocPhysical(rtDrvMemHandle *handle, size_t size, rtDrvMemProp_t *prop, uint64_t flags) {
    HAMI_RT_ENTER(rtMallocPhysical);
    if (!handle || !prop || prop->side != RT_MEM_DEV_SIDE) return hami_real.rtMallocPhysical(handle, size, prop, flags);
    int device;
    if (reserve_runtime((int)prop->devid, size, &device) != 0) return ACL_ERROR_RT_MEMORY_ALLOCATION;
    rtError_t r = hami_real.rtMallocPhysical(handle, size, prop, flags);
    if (r != RT_ERROR_NONE) {
        hami_iso_memory_release(device, size);
        return r;
    }
    remember(HAMI_ISO_HANDLE, (uint64_t)(uintptr_t)*handle, device, size);
    return r;
}

HAMI_EXPORT rtError_t rtFreePhysical(rtDrvMemHandle handle) {
    HAMI_RT_ENTER(rtFreePhysical);
    hami_iso_allocation a;
    uint64_t key = (uint64_t)(uintptr_t)handle;
    int known = hami_iso_untrack(HAMI_ISO_HANDLE, key, &a);
    rtError_t r = hami_real.rtFreePhysical(handle);
    forgotten(HAMI_ISO_HANDLE, key, known, &a, r);
    return r;
}

/* ---- the AscendCL layer -------------------------------------------------------------------------------- */

/* An AscendCL allocation of `estimate` bytes (on `device`) around `call`: reserved here, taken over by a runtime
 * hook underneath when the call reaches one, remembered here under `key_of` otherwise. */
#define ACL_ALLOC(name, kind, device_expr, estimate_expr, call, key_of)                                        \
    HAMI_ACL_ENTER(name);                                                                                      \
    struct hami_vnpu_thread *t = &hami_vnpu_tls;                                                               \
    if (t->pending) return hami_real.call; /* inside another AscendCL allocation: it counts */                 \
    int device = (device_expr);                                                                                \
    uint64_t estimate = (estimate_expr);                                                                       \
    if (reserve(device, estimate) != 0) return ACL_ERROR_RT_MEMORY_ALLOCATION;                                 \
    t->pending = 1;                                                                                            \
    t->pending_taken = 0;                                                                                      \
    t->pending_device = device;                                                                                \
    t->pending_bytes = estimate;                                                                               \
    t->depth++;                                                                                                \
    aclError r = hami_real.call;                                                                               \
    t->depth--;                                                                                                \
    t->pending = 0;                                                                                            \
    if (t->pending_taken) return r;                                                                            \
    if (r != ACL_SUCCESS) {                                                                                    \
        hami_iso_memory_release(device, estimate);                                                             \
        return r;                                                                                              \
    }                                                                                                          \
    remember((kind), (key_of), device, estimate);                                                              \
    return r;

static inline uint64_t align32(uint64_t size) { return (size + 31u) & ~(uint64_t)31u; }

HAMI_EXPORT aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    if (!devPtr) {
        HAMI_ACL_ENTER(aclrtMalloc);
        return hami_real.aclrtMalloc(devPtr, size, policy);
    }
    /* AscendCL aligns to 32 bytes and pads with 32 more */
    ACL_ALLOC(aclrtMalloc, HAMI_ISO_POINTER, hami_vnpu_device(), align32(size) + 32u,
              aclrtMalloc(devPtr, size, policy), (uint64_t)(uintptr_t)*devPtr)
}

HAMI_EXPORT aclError aclrtMallocCached(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    if (!devPtr) {
        HAMI_ACL_ENTER(aclrtMallocCached);
        return hami_real.aclrtMallocCached(devPtr, size, policy);
    }
    ACL_ALLOC(aclrtMallocCached, HAMI_ISO_POINTER, hami_vnpu_device(), align32(size) + 32u,
              aclrtMallocCached(devPtr, size, policy), (uint64_t)(uintptr_t)*devPtr)
}

HAMI_EXPORT aclError aclrtMallocAlign32(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    if (!devPtr) {
        HAMI_ACL_ENTER(aclrtMallocAlign32);
        return hami_real.aclrtMallocAlign32(devPtr, size, policy);
    }
    /* aligned, not padded */
    ACL_ALLOC(aclrtMallocAlign32, HAMI_ISO_POINTER, hami_vnpu_device(), align32(size),
              aclrtMallocAlign32(devPtr, size, policy), (uint64_t)(uintptr_t)*devPtr)
}

HAMI_EXPORT aclError aclrtFree(void *devPtr) {
    HAMI_ACL_ENTER(aclrtFree);
    hami_iso_allocation a;
    uint64_t key = (uint64_t)(uintptr_t)devPtr;
    int known = hami_iso_untrack(HAMI_ISO_POINTER, key, &a);
    aclError r = hami_real.aclrtFree(devPtr);
    forgotten(HAMI_ISO_POINTER, key, known, &a, r);
    return r;
}

HAMI_EXPORT aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop,
                                         uint64_t flags) {
    if (!handle || !prop || prop->location.type != ACL_MEM_LOCATION_TYPE_DEVICE) {
        HAMI_ACL_ENTER(aclrtMallocPhysical);
        return hami_real.aclrtMallocPhysical(handle, size, prop, flags);
    }
    ACL_ALLOC(aclrtMallocPhysical, HAMI_ISO_HANDLE, (int)prop->location.id, size,
              aclrtMallocPhysical(handle, size, prop, flags), (uint64_t)(uintptr_t)*handle)
}

HAMI_EXPORT aclError aclrtFreePhysical(aclrtDrvMemHandle handle) {
    HAMI_ACL_ENTER(aclrtFreePhysical);
    hami_iso_allocation a;
    uint64_t key = (uint64_t)(uintptr_t)handle;
    int known = hami_iso_untrack(HAMI_ISO_HANDLE, key, &a);
    aclError r = hami_real.aclrtFreePhysical(handle);
    forgotten(HAMI_ISO_HANDLE, key, known, &a, r);
    return r;
}

/* ---- queries -------------------------------------------------------------------------------------------- */

/* The container's view of the current device's memory, from the physical numbers. */
static inline void limited_view(size_t *free, size_t *total) { hami_iso_memory_view_sizes(hami_vnpu_device(), free, total); }

HAMI_EXPORT rtError_t rtMemGetInfoEx(rtMemInfoType_t memInfoType, size_t *free, size_t *total) {
    HAMI_RT_ENTER(rtMemGetInfoEx);
    rtError_t r = hami_real.rtMemGetInfoEx(memInfoType, free, total);
    if (r == RT_ERROR_NONE && free && total) limited_view(free, total);
    return r;
}

HAMI_EXPORT rtError_t rtMemGetInfo(size_t *free, size_t *total) {
    HAMI_RT_ENTER(rtMemGetInfo);
    rtError_t r = hami_real.rtMemGetInfo(free, total);
    if (r == RT_ERROR_NONE && free && total) limited_view(free, total);
    return r;
}

HAMI_EXPORT aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total) {
    HAMI_ACL_ENTER(aclrtGetMemInfo);
    aclError r = hami_real.aclrtGetMemInfo(attr, free, total);
    if (r == ACL_SUCCESS && free && total) limited_view(free, total);
    return r;
}
