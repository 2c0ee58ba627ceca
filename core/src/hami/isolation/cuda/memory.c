/*
 * memory.c: device memory, checked before it is allocated and counted exactly.
 *
 * Every allocating call reserves its size with the core first (over the limit: CUDA_ERROR_OUT_OF_MEMORY, the
 * driver is never asked), calls the driver, gives the reservation back if the driver failed, and remembers the
 * size under the pointer or handle. Every freeing call forgets it, frees, and releases exactly that size after
 * the driver succeeded (so what the driver holds never exceeds what is counted). Sizes the driver decides
 * (the pitch) are reserved at their upper bound and corrected after the call. Arrays are counted at
 * width x height x depth x element size (x levels for mipmaps); formats this file does not know at 16 bytes
 * per element. Host allocations (cuMemCreate with a host location) are not device memory and pass.
 *
 * The queries answer with the container's view: total = min(limit, physical), free = min(limit - used,
 * physical free), never below zero; with no limit the driver's own numbers; with CUDA_OVERSUBSCRIBE the limit
 * even above the physical size. NVML handles map to CUDA indices through nvmlDeviceGetIndex (the container
 * sees its devices in the same order through both).
 */
#define _GNU_SOURCE
#include <string.h>

#include "hami_cuda.h"

static inline CUresult reserve(int device, uint64_t bytes) {
    return hami_iso_memory_reserve(device, bytes) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static inline void remember(uint32_t kind, uint64_t key, int device, uint64_t size, uint64_t owner) {
    hami_iso_remember(kind, key, device, size, owner);
}

/* After the driver answered a free of (kind, key): release what was counted, or keep counting if it failed. */
static inline void forgotten(uint32_t kind, uint64_t key, int known, const hami_iso_allocation *a, CUresult r) {
    hami_iso_forgotten(kind, key, known, a, r == CUDA_SUCCESS);
}

/* ---- linear memory ------------------------------------------------------------------------------------ */

HAMI_EXPORT CUresult HAMI_CU(MemAlloc_v2)(CUdeviceptr *dptr, size_t bytesize) {
    HAMI_CUDA_ENTER(HAMI_CU(MemAlloc_v2));
    int device = hami_cu_device();
    if (reserve(device, bytesize) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = hami_real.HAMI_CU(MemAlloc_v2)(dptr, bytesize);
    if (r != CUDA_SUCCESS) {
        hami_iso_memory_release(device, bytesize);
        return r;
    }
    remember(HAMI_ISO_POINTER, *dptr, device, bytesize, (uint64_t)(uintptr_t)hami_cu_tls.context);
    return r;
}

#define PITCH_ALIGNMENT 512u /* the largest pitch alignment drivers use */

HAMI_EXPORT CUresult HAMI_CU(MemAllocPitch_v2)(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                        unsigned int ElementSizeBytes) {
    HAMI_CUDA_ENTER(HAMI_CU(MemAllocPitch_v2));
    int device = hami_cu_device();
    uint64_t row = ((uint64_t)WidthInBytes + PITCH_ALIGNMENT - 1) / PITCH_ALIGNMENT * PITCH_ALIGNMENT, bound;
    if (row < WidthInBytes || __builtin_mul_overflow(row, (uint64_t)Height, &bound)) bound = UINT64_MAX;
    if (reserve(device, bound) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = hami_real.HAMI_CU(MemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r != CUDA_SUCCESS) {
        hami_iso_memory_release(device, bound);
        return r;
    }
    uint64_t exact = (uint64_t)*pPitch * (uint64_t)Height;
    if (exact < bound) {
        hami_iso_memory_release(device, bound - exact);
    } else if (exact > bound && reserve(device, exact - bound) != CUDA_SUCCESS) {
        hami_real.HAMI_CU(MemFree_v2)(*dptr);
        hami_iso_memory_release(device, bound);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    remember(HAMI_ISO_POINTER, *dptr, device, exact, (uint64_t)(uintptr_t)hami_cu_tls.context);
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(MemAllocManaged)(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    HAMI_CUDA_ENTER(HAMI_CU(MemAllocManaged));
    int device = hami_cu_device();
    if (reserve(device, bytesize) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = hami_real.HAMI_CU(MemAllocManaged)(dptr, bytesize, flags);
    if (r != CUDA_SUCCESS) {
        hami_iso_memory_release(device, bytesize);
        return r;
    }
    remember(HAMI_ISO_POINTER, *dptr, device, bytesize, (uint64_t)(uintptr_t)hami_cu_tls.context);
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(MemFree_v2)(CUdeviceptr dptr) {
    HAMI_CUDA_ENTER(HAMI_CU(MemFree_v2));
    hami_iso_allocation a;
    int known = hami_iso_untrack(HAMI_ISO_POINTER, dptr, &a);
    CUresult r = hami_real.HAMI_CU(MemFree_v2)(dptr);
    forgotten(HAMI_ISO_POINTER, dptr, known, &a, r);
    return r;
}

/* ---- virtual memory management ------------------------------------------------------------------------- */

HAMI_EXPORT CUresult HAMI_CU(MemCreate)(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                 unsigned long long flags) {
    HAMI_CUDA_ENTER(HAMI_CU(MemCreate));
    if (!prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return hami_real.HAMI_CU(MemCreate)(handle, size, prop, flags);
    int device = prop->location.id;
    if (reserve(device, size) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = hami_real.HAMI_CU(MemCreate)(handle, size, prop, flags);
    if (r != CUDA_SUCCESS) {
        hami_iso_memory_release(device, size);
        return r;
    }
    remember(HAMI_ISO_HANDLE, *handle, device, size, 0);
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(MemRelease)(CUmemGenericAllocationHandle handle) {
    HAMI_CUDA_ENTER(HAMI_CU(MemRelease));
    hami_iso_allocation a;
    int known = hami_iso_untrack(HAMI_ISO_HANDLE, handle, &a);
    CUresult r = hami_real.HAMI_CU(MemRelease)(handle);
    forgotten(HAMI_ISO_HANDLE, handle, known, &a, r);
    return r;
}

/* ---- stream-ordered allocation and pools ---------------------------------------------------------------- */

#define MAX_POOLS 64
static _Atomic(uintptr_t) g_pool[MAX_POOLS];
static _Atomic int g_pool_device[MAX_POOLS];

static int pool_device(CUmemoryPool pool) {
    for (int i = 0; i < MAX_POOLS; i++)
        if (atomic_load_explicit(&g_pool[i], memory_order_acquire) == (uintptr_t)pool)
            return atomic_load_explicit(&g_pool_device[i], memory_order_relaxed);
    return hami_cu_device(); /* a device's default pool: the current device */
}

HAMI_EXPORT CUresult HAMI_CU(MemPoolCreate)(CUmemoryPool *pool, const CUmemPoolProps *poolProps) {
    HAMI_CUDA_ENTER(HAMI_CU(MemPoolCreate));
    CUresult r = hami_real.HAMI_CU(MemPoolCreate)(pool, poolProps);
    if (r != CUDA_SUCCESS || !pool || !poolProps || poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return r;
    for (int i = 0; i < MAX_POOLS; i++) {
        uintptr_t empty = 0; /* claim the entry with a marker no pool handle equals, then fill it */
        if (!atomic_compare_exchange_strong(&g_pool[i], &empty, (uintptr_t)1)) continue;
        atomic_store_explicit(&g_pool_device[i], poolProps->location.id, memory_order_relaxed);
        atomic_store_explicit(&g_pool[i], (uintptr_t)*pool, memory_order_release);
        break;
    }
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(MemPoolDestroy)(CUmemoryPool pool) {
    HAMI_CUDA_ENTER(HAMI_CU(MemPoolDestroy));
    for (int i = 0; i < MAX_POOLS; i++) {
        uintptr_t mine = (uintptr_t)pool;
        if (mine && atomic_compare_exchange_strong(&g_pool[i], &mine, 0)) break;
    }
    return hami_real.HAMI_CU(MemPoolDestroy)(pool);
}

#define ALLOC_ASYNC(name, device_expr, call)                                                                   \
    HAMI_CUDA_ENTER(name);                                                                                     \
    int device = (device_expr);                                                                                \
    if (reserve(device, bytesize) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;                            \
    CUresult r = hami_real.call;                                                                               \
    if (r != CUDA_SUCCESS) {                                                                                   \
        hami_iso_memory_release(device, bytesize);                                                             \
        return r;                                                                                              \
    }                                                                                                          \
    remember(HAMI_ISO_POINTER, *dptr, device, bytesize, (uint64_t)(uintptr_t)hami_cu_tls.context);            \
    return r;

HAMI_EXPORT CUresult HAMI_CU(MemAllocAsync)(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    ALLOC_ASYNC(HAMI_CU(MemAllocAsync), hami_cu_device(), HAMI_CU(MemAllocAsync)(dptr, bytesize, hStream))
}

HAMI_EXPORT CUresult HAMI_CU(MemAllocAsync_ptsz)(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    ALLOC_ASYNC(HAMI_CU(MemAllocAsync_ptsz), hami_cu_device(), HAMI_CU(MemAllocAsync_ptsz)(dptr, bytesize, hStream))
}

HAMI_EXPORT CUresult HAMI_CU(MemAllocFromPoolAsync)(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                             CUstream hStream) {
    ALLOC_ASYNC(HAMI_CU(MemAllocFromPoolAsync), pool_device(pool), HAMI_CU(MemAllocFromPoolAsync)(dptr, bytesize, pool, hStream))
}

HAMI_EXPORT CUresult HAMI_CU(MemAllocFromPoolAsync_ptsz)(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                  CUstream hStream) {
    ALLOC_ASYNC(HAMI_CU(MemAllocFromPoolAsync_ptsz), pool_device(pool),
                HAMI_CU(MemAllocFromPoolAsync_ptsz)(dptr, bytesize, pool, hStream))
}

HAMI_EXPORT CUresult HAMI_CU(MemFreeAsync)(CUdeviceptr dptr, CUstream hStream) {
    HAMI_CUDA_ENTER(HAMI_CU(MemFreeAsync));
    hami_iso_allocation a;
    int known = hami_iso_untrack(HAMI_ISO_POINTER, dptr, &a);
    CUresult r = hami_real.HAMI_CU(MemFreeAsync)(dptr, hStream);
    forgotten(HAMI_ISO_POINTER, dptr, known, &a, r);
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(MemFreeAsync_ptsz)(CUdeviceptr dptr, CUstream hStream) {
    HAMI_CUDA_ENTER(HAMI_CU(MemFreeAsync_ptsz));
    hami_iso_allocation a;
    int known = hami_iso_untrack(HAMI_ISO_POINTER, dptr, &a);
    CUresult r = hami_real.HAMI_CU(MemFreeAsync_ptsz)(dptr, hStream);
    forgotten(HAMI_ISO_POINTER, dptr, known, &a, r);
    return r;
}

/* ---- arrays --------------------------------------------------------------------------------------------- */

/* Bytes of one element, or 0 when the format already includes its channels (the packed normalized formats). */
static uint64_t format_bytes(CUarray_format format, unsigned channels, int *packed) {
    *packed = 0;
    switch (format) {
    case 0x01: case 0x08: return 1;            /* UNSIGNED_INT8, SIGNED_INT8 */
    case 0x02: case 0x09: case 0x10: return 2; /* UNSIGNED_INT16, SIGNED_INT16, HALF */
    case 0x03: case 0x0a: case 0x20: return 4; /* UNSIGNED_INT32, SIGNED_INT32, FLOAT */
    default: break;
    }
    *packed = 1;
    switch (format) {
    case 0xc0: case 0xc6: return 1; /* UNORM/SNORM_INT8X1 */
    case 0xc1: case 0xc7: return 2; /* ..INT8X2 */
    case 0xc2: case 0xc8: return 4; /* ..INT8X4 */
    case 0xc3: case 0xc9: return 2; /* ..INT16X1 */
    case 0xc4: case 0xca: return 4; /* ..INT16X2 */
    case 0xc5: case 0xcb: return 8; /* ..INT16X4 */
    default: (void)channels; return 16; /* not known here: the largest element there is */
    }
}

static uint64_t array_bytes(size_t width, size_t height, size_t depth, CUarray_format format, unsigned channels,
                            unsigned flags, unsigned levels) {
    int packed;
    uint64_t element = format_bytes(format, channels, &packed);
    if (!packed) element *= channels ? channels : 1;
    uint64_t total = 0;
    int layered = (flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
    for (unsigned level = 0; level < (levels ? levels : 1); level++) {
        uint64_t w = width >> level, h = height >> level, d = layered ? depth : depth >> level, bytes;
        if (!w) w = 1;
        if (!h) h = 1;
        if (!d) d = 1;
        if (__builtin_mul_overflow(w, h, &bytes) || __builtin_mul_overflow(bytes, d, &bytes) ||
            __builtin_mul_overflow(bytes, element, &bytes) || __builtin_add_overflow(total, bytes, &total))
            return UINT64_MAX;
        if (level < 63 && (width >> level) <= 1 && (height >> level) <= 1 && (layered || (depth >> level) <= 1))
            break; /* all further levels are 1x1x1 and the driver stops there */
    }
    return total;
}

HAMI_EXPORT CUresult HAMI_CU(ArrayCreate_v2)(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray) {
    HAMI_CUDA_ENTER(HAMI_CU(ArrayCreate_v2));
    if (!pAllocateArray) return hami_real.HAMI_CU(ArrayCreate_v2)(pHandle, pAllocateArray);
    int device = hami_cu_device();
    uint64_t bytes = array_bytes(pAllocateArray->Width, pAllocateArray->Height, 0, pAllocateArray->Format,
                                 pAllocateArray->NumChannels, 0, 1);
    if (reserve(device, bytes) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = hami_real.HAMI_CU(ArrayCreate_v2)(pHandle, pAllocateArray);
    if (r != CUDA_SUCCESS) {
        hami_iso_memory_release(device, bytes);
        return r;
    }
    remember(HAMI_ISO_ARRAY, (uint64_t)(uintptr_t)*pHandle, device, bytes, (uint64_t)(uintptr_t)hami_cu_tls.context);
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(Array3DCreate_v2)(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray) {
    HAMI_CUDA_ENTER(HAMI_CU(Array3DCreate_v2));
    if (!pAllocateArray) return hami_real.HAMI_CU(Array3DCreate_v2)(pHandle, pAllocateArray);
    int device = hami_cu_device();
    const CUDA_ARRAY3D_DESCRIPTOR *d = pAllocateArray;
    uint64_t bytes = array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags, 1);
    if (reserve(device, bytes) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = hami_real.HAMI_CU(Array3DCreate_v2)(pHandle, pAllocateArray);
    if (r != CUDA_SUCCESS) {
        hami_iso_memory_release(device, bytes);
        return r;
    }
    remember(HAMI_ISO_ARRAY, (uint64_t)(uintptr_t)*pHandle, device, bytes, (uint64_t)(uintptr_t)hami_cu_tls.context);
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(ArrayDestroy)(CUarray hArray) {
    HAMI_CUDA_ENTER(HAMI_CU(ArrayDestroy));
    hami_iso_allocation a;
    int known = hami_iso_untrack(HAMI_ISO_ARRAY, (uint64_t)(uintptr_t)hArray, &a);
    CUresult r = hami_real.HAMI_CU(ArrayDestroy)(hArray);
    forgotten(HAMI_ISO_ARRAY, (uint64_t)(uintptr_t)hArray, known, &a, r);
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(MipmappedArrayCreate)(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                            unsigned int numMipmapLevels) {
    HAMI_CUDA_ENTER(HAMI_CU(MipmappedArrayCreate));
    if (!pMipmappedArrayDesc) return hami_real.HAMI_CU(MipmappedArrayCreate)(pHandle, pMipmappedArrayDesc, numMipmapLevels);
    int device = hami_cu_device();
    const CUDA_ARRAY3D_DESCRIPTOR *d = pMipmappedArrayDesc;
    uint64_t bytes = array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags, numMipmapLevels);
    if (reserve(device, bytes) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = hami_real.HAMI_CU(MipmappedArrayCreate)(pHandle, pMipmappedArrayDesc, numMipmapLevels);
    if (r != CUDA_SUCCESS) {
        hami_iso_memory_release(device, bytes);
        return r;
    }
    remember(HAMI_ISO_MIPMAP, (uint64_t)(uintptr_t)*pHandle, device, bytes, (uint64_t)(uintptr_t)hami_cu_tls.context);
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(MipmappedArrayDestroy)(CUmipmappedArray hMipmappedArray) {
    HAMI_CUDA_ENTER(HAMI_CU(MipmappedArrayDestroy));
    hami_iso_allocation a;
    uint64_t key = (uint64_t)(uintptr_t)hMipmappedArray;
    int known = hami_iso_untrack(HAMI_ISO_MIPMAP, key, &a);
    CUresult r = hami_real.HAMI_CU(MipmappedArrayDestroy)(hMipmappedArray);
    forgotten(HAMI_ISO_MIPMAP, key, known, &a, r);
    return r;
}

/* ---- queries -------------------------------------------------------------------------------------------- */

HAMI_EXPORT CUresult HAMI_CU(MemGetInfo_v2)(size_t *free, size_t *total) {
    HAMI_CUDA_ENTER(HAMI_CU(MemGetInfo_v2));
    CUresult r = hami_real.HAMI_CU(MemGetInfo_v2)(free, total);
    if (r == CUDA_SUCCESS && free && total) hami_iso_memory_view_sizes(hami_cu_device(), free, total);
    return r;
}

HAMI_EXPORT CUresult HAMI_CU(DeviceTotalMem_v2)(size_t *bytes, CUdevice dev) {
    HAMI_CUDA_ENTER(HAMI_CU(DeviceTotalMem_v2));
    CUresult r = hami_real.HAMI_CU(DeviceTotalMem_v2)(bytes, dev);
    if (r == CUDA_SUCCESS && bytes) hami_iso_memory_view_sizes(dev, NULL, bytes);
    return r;
}

#ifdef HAMI_CUDA_NVML_LIBRARIES /* the NVML-compatible management library's view of the same memory */

#define NVML_HANDLES 16
static _Atomic(uintptr_t) g_nvml_handle[NVML_HANDLES];
static _Atomic int g_nvml_index[NVML_HANDLES];

static int nvml_index(nvmlDevice_t device) {
    uintptr_t key = (uintptr_t)device;
    for (int i = 0; i < NVML_HANDLES; i++)
        if (atomic_load_explicit(&g_nvml_handle[i], memory_order_acquire) == key)
            return atomic_load_explicit(&g_nvml_index[i], memory_order_relaxed);
    unsigned index = 0;
    if (!hami_real.nvmlDeviceGetIndex || hami_real.nvmlDeviceGetIndex(device, &index) != NVML_SUCCESS) return -1;
    for (int i = 0; i < NVML_HANDLES; i++) {
        uintptr_t empty = 0; /* claim the entry with a marker no handle equals, then fill it */
        if (!atomic_compare_exchange_strong(&g_nvml_handle[i], &empty, (uintptr_t)1)) continue;
        atomic_store_explicit(&g_nvml_index[i], (int)index, memory_order_relaxed);
        atomic_store_explicit(&g_nvml_handle[i], key, memory_order_release);
        break;
    }
    return (int)index;
}

HAMI_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    HAMI_NVML_ENTER(nvmlDeviceGetMemoryInfo);
    nvmlReturn_t r = hami_real.nvmlDeviceGetMemoryInfo(device, memory);
    if (r != NVML_SUCCESS || !memory) return r;
    uint64_t total = memory->total, free = memory->free, used = memory->used;
    if (hami_iso_memory_view(nvml_index(device), &total, &free, &used)) {
        memory->total = total;
        memory->free = free;
        memory->used = used;
    }
    return r;
}

HAMI_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    HAMI_NVML_ENTER(nvmlDeviceGetMemoryInfo_v2);
    nvmlReturn_t r = hami_real.nvmlDeviceGetMemoryInfo_v2(device, memory);
    if (r != NVML_SUCCESS || !memory) return r;
    uint64_t total = memory->total, free = memory->free, used = memory->used;
    if (hami_iso_memory_view(nvml_index(device), &total, &free, &used)) {
        uint64_t rest = total > used + free && used + free >= used ? total - used - free : 0;
        memory->total = total;
        memory->free = free;
        memory->used = used;
        if (memory->reserved > rest) memory->reserved = rest;
    }
    return r;
}
#endif
