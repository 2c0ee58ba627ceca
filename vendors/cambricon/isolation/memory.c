/*
 * memory.c: device memory, checked before it is allocated and counted exactly once.
 *
 * Every allocating call, CNDrv's (cnMalloc, cnMallocSecurity, cnMallocNode, cnZmalloc, cnZmallocNode,
 * cnMallocConstant, cnMallocNodeConstant, cnMallocFrameBuffer, cnMallocPeerAble, cnMemAllocAsync,
 * cnMemAllocFromPoolAsync, cnMemCreate) and CNRT's (cnrtMalloc), reserves its size with the core first (over the
 * limit: the API's own out-of-memory code, CN_MEMORY_ERROR_OUT_OF_MEMORY / cnrtErrorNoMem, both 100100; the driver
 * is never asked), calls the real function, gives the reservation back if that failed, and remembers the size under
 * the address (or the physical handle of cnMemCreate). Every freeing call (cnFree, cnMemFreeAsync, cnMemRelease,
 * cnrtFree) forgets it, frees, and releases exactly that size after the real free succeeded. Host allocations
 * (cnMallocHost) are not device memory and are not hooked. Calls from inside CNDrv or CNRT pass straight through
 * (runtime.c): cnrtMalloc reaching cnMalloc underneath is counted once.
 *
 * The queries answer with the container's view: cnMemGetInfo, cnrtMemGetInfo and cnMemGetNodeInfo (one memory node
 * of the current device) total = min(limit, physical), free = min(limit - used, physical free); cnDeviceTotalMem
 * the limit of the device asked about (CNdev taken as its ordinal, as cnCtxGetDevice's is read in runtime.c), and
 * cnrtDeviceGetAttribute's cnrtAttrTotalMemSize (MB, what torch_mlu reports as a device's total memory) the same
 * in MB; every other attribute is passed through unread. The physical numbers without a limit.
 */
#define _GNU_SOURCE
#include "vmlu.h"

#define OWNER_OF(device) ((uint64_t)(device) + 1u)

static inline void remember(uint32_t kind, uint64_t key, int device, uint64_t size) {
    hami_iso_remember(kind, key, device, size, OWNER_OF(device));
}

/* An allocation of `size` bytes on the current device around `call` (`addr` receives the address). */
#define COUNTED_ALLOC(enter, name, result, ok, oom, addr, size, call)                                          \
    enter(name);                                                                                               \
    if (!(addr) || FROM_INSIDE()) return hami_real.call;                                                       \
    int device = hami_vmlu_device();                                                                           \
    uint64_t counted = (uint64_t)(size);                                                                       \
    if (hami_iso_memory_reserve(device, counted) != 0) return (oom);                                           \
    result r = hami_real.call;                                                                                 \
    if (r != (ok)) {                                                                                           \
        hami_iso_memory_release(device, counted);                                                              \
        return r;                                                                                              \
    }                                                                                                          \
    remember(HAMI_ISO_POINTER, (uint64_t)(uintptr_t) * (addr), device, counted);                               \
    return r;

#define CN_ALLOC(name, addr, size, call)                                                                       \
    COUNTED_ALLOC(HAMI_CN_ENTER, name, CNresult, CN_SUCCESS, CN_MEMORY_ERROR_OUT_OF_MEMORY, addr, size, call)

/* A free of the allocation under `key` around `call`. */
#define COUNTED_FREE(enter, name, result, ok, kind, key, call)                                                 \
    enter(name);                                                                                               \
    if (FROM_INSIDE()) return hami_real.call;                                                                  \
    hami_iso_allocation a;                                                                                     \
    uint64_t k = (uint64_t)(key);                                                                              \
    int known = hami_iso_untrack((kind), k, &a);                                                               \
    result r = hami_real.call;                                                                                 \
    hami_iso_forgotten((kind), k, known, &a, r == (ok));                                                       \
    return r;

#define CN_FREE(name, kind, key, call) COUNTED_FREE(HAMI_CN_ENTER, name, CNresult, CN_SUCCESS, kind, key, call)

HAMI_EXPORT CNresult cnMalloc(CNaddr *p, cn_uint64_t bytes) { CN_ALLOC(cnMalloc, p, bytes, cnMalloc(p, bytes)) }

HAMI_EXPORT CNresult cnMallocSecurity(CNaddr *p, cn_uint64_t bytes) {
    CN_ALLOC(cnMallocSecurity, p, bytes, cnMallocSecurity(p, bytes))
}

HAMI_EXPORT CNresult cnMallocNode(CNaddr *p, cn_uint64_t bytes, int node) {
    CN_ALLOC(cnMallocNode, p, bytes, cnMallocNode(p, bytes, node))
}

HAMI_EXPORT CNresult cnZmalloc(CNaddr *p, cn_uint64_t bytes) { CN_ALLOC(cnZmalloc, p, bytes, cnZmalloc(p, bytes)) }

HAMI_EXPORT CNresult cnZmallocNode(CNaddr *p, cn_uint64_t bytes, int node) {
    CN_ALLOC(cnZmallocNode, p, bytes, cnZmallocNode(p, bytes, node))
}

HAMI_EXPORT CNresult cnMallocConstant(CNaddr *p, cn_uint64_t bytes) {
    CN_ALLOC(cnMallocConstant, p, bytes, cnMallocConstant(p, bytes))
}

HAMI_EXPORT CNresult cnMallocNodeConstant(CNaddr *p, cn_uint64_t bytes, int node) {
    CN_ALLOC(cnMallocNodeConstant, p, bytes, cnMallocNodeConstant(p, bytes, node))
}

HAMI_EXPORT CNresult cnMallocFrameBuffer(CNaddr *p, cn_uint64_t bytes, int node) {
    CN_ALLOC(cnMallocFrameBuffer, p, bytes, cnMallocFrameBuffer(p, bytes, node))
}

HAMI_EXPORT CNresult cnMallocPeerAble(CNaddr *p, cn_uint64_t bytes) {
    CN_ALLOC(cnMallocPeerAble, p, bytes, cnMallocPeerAble(p, bytes))
}

HAMI_EXPORT CNresult cnMemAllocAsync(CNaddr *p, size_t bytes, CNqueue queue) {
    CN_ALLOC(cnMemAllocAsync, p, bytes, cnMemAllocAsync(p, bytes, queue))
}

HAMI_EXPORT CNresult cnMemAllocFromPoolAsync(CNaddr *p, size_t bytes, CNmemoryPool pool, CNqueue queue) {
    CN_ALLOC(cnMemAllocFromPoolAsync, p, bytes, cnMemAllocFromPoolAsync(p, bytes, pool, queue))
}

HAMI_EXPORT CNresult cnMemCreate(CNmemGenericAllocationHandle *handle, cn_uint64_t size, CNmemAllocationProp *prop,
                                 cn_uint64_t flags) {
    HAMI_CN_ENTER(cnMemCreate);
    if (!handle || FROM_INSIDE()) return hami_real.cnMemCreate(handle, size, prop, flags);
    int device = hami_vmlu_device();
    if (hami_iso_memory_reserve(device, size) != 0) return CN_MEMORY_ERROR_OUT_OF_MEMORY;
    CNresult r = hami_real.cnMemCreate(handle, size, prop, flags);
    if (r != CN_SUCCESS) {
        hami_iso_memory_release(device, size);
        return r;
    }
    remember(HAMI_ISO_HANDLE, (uint64_t)*handle, device, size);
    return r;
}

HAMI_EXPORT CNresult cnFree(CNaddr addr) { CN_FREE(cnFree, HAMI_ISO_POINTER, addr, cnFree(addr)) }

HAMI_EXPORT CNresult cnMemFreeAsync(CNaddr addr, CNqueue queue) {
    CN_FREE(cnMemFreeAsync, HAMI_ISO_POINTER, addr, cnMemFreeAsync(addr, queue))
}

HAMI_EXPORT CNresult cnMemRelease(CNmemGenericAllocationHandle handle) {
    CN_FREE(cnMemRelease, HAMI_ISO_HANDLE, handle, cnMemRelease(handle))
}

HAMI_EXPORT cnrtRet_t cnrtMalloc(void **p, size_t bytes) {
    COUNTED_ALLOC(HAMI_CNRT_ENTER, cnrtMalloc, cnrtRet_t, cnrtSuccess, cnrtErrorNoMem, p, bytes, cnrtMalloc(p, bytes))
}

HAMI_EXPORT cnrtRet_t cnrtFree(void *p) {
    COUNTED_FREE(HAMI_CNRT_ENTER, cnrtFree, cnrtRet_t, cnrtSuccess, HAMI_ISO_POINTER, (uintptr_t)p, cnrtFree(p))
}

/* ---- queries -------------------------------------------------------------------------------------------- */

HAMI_EXPORT CNresult cnMemGetInfo(cn_uint64_t *free, cn_uint64_t *total) {
    HAMI_CN_ENTER(cnMemGetInfo);
    CNresult r = hami_real.cnMemGetInfo(free, total);
    if (r == CN_SUCCESS && free && total && !FROM_INSIDE()) hami_iso_memory_view(hami_vmlu_device(), total, free, NULL);
    return r;
}

HAMI_EXPORT cnrtRet_t cnrtMemGetInfo(size_t *free, size_t *total) {
    HAMI_CNRT_ENTER(cnrtMemGetInfo);
    cnrtRet_t r = hami_real.cnrtMemGetInfo(free, total);
    if (r == cnrtSuccess && free && total && !FROM_INSIDE())
        hami_iso_memory_view_sizes(hami_vmlu_device(), free, total);
    return r;
}

HAMI_EXPORT CNresult cnMemGetNodeInfo(cn_uint64_t *free, cn_uint64_t *total, int node) {
    HAMI_CN_ENTER(cnMemGetNodeInfo);
    CNresult r = hami_real.cnMemGetNodeInfo(free, total, node);
    if (r == CN_SUCCESS && free && total && !FROM_INSIDE()) hami_iso_memory_view(hami_vmlu_device(), total, free, NULL);
    return r;
}

HAMI_EXPORT CNresult cnDeviceTotalMem(cn_uint64_t *bytes, CNdev dev) {
    HAMI_CN_ENTER(cnDeviceTotalMem);
    CNresult r = hami_real.cnDeviceTotalMem(bytes, dev);
    if (r == CN_SUCCESS && bytes && dev <= INT32_MAX && !FROM_INSIDE())
        hami_iso_memory_view((int)dev, bytes, NULL, NULL);
    return r;
}

HAMI_EXPORT cnrtRet_t cnrtDeviceGetAttribute(int *value, cnrtDeviceAttr_t attr, int device) {
    HAMI_CNRT_ENTER(cnrtDeviceGetAttribute);
    cnrtRet_t r = hami_real.cnrtDeviceGetAttribute(value, attr, device);
    if (r != cnrtSuccess || !value || attr != cnrtAttrTotalMemSize || *value < 0 || FROM_INSIDE()) return r;
    uint64_t total = (uint64_t)*value << 20;
    if (hami_iso_memory_view(device, &total, NULL, NULL) == 0) return r; /* no limit: the physical size */
    *value = total >> 20 > INT32_MAX ? INT32_MAX : (int)(total >> 20);
    return r;
}
