/*
 * aliases.c: the MUSA driver's unversioned names. CUDA's headers bind cuMemAlloc to cuMemAlloc_v2 (the layer hooks
 * the _v2 functions); MUSA's driver exports muMemAlloc and muMemAlloc_v2 both, and a program may bind either. Each
 * unversioned name here is the layer's hook of its _v2 function (the same 64-bit signature), so no name of the
 * driver's memory or context API reaches the driver unseen. The layer's dlsym and muGetProcAddress answer them
 * too (HAMI_CUDA_VENDOR_HOOKS; muGetProcAddress maps a name and version to the _v2 hook itself). They are declared
 * with cuda_api.h's plain types (hami_cuda_vendor.h is included before it).
 */
#define _GNU_SOURCE
#include "hami_cuda.h"

HAMI_EXPORT int muMemAlloc(unsigned long long *dptr, size_t bytesize) { return muMemAlloc_v2(dptr, bytesize); }

HAMI_EXPORT int muMemAllocPitch(unsigned long long *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                unsigned int ElementSizeBytes) {
    return muMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
}

HAMI_EXPORT int muMemFree(unsigned long long dptr) { return muMemFree_v2(dptr); }

HAMI_EXPORT int muMemGetInfo(size_t *free, size_t *total) { return muMemGetInfo_v2(free, total); }

HAMI_EXPORT int muDeviceTotalMem(size_t *bytes, int dev) { return muDeviceTotalMem_v2(bytes, dev); }

HAMI_EXPORT int muCtxCreate(struct CUctx_st **pctx, unsigned int flags, int dev) {
    return muCtxCreate_v2(pctx, flags, dev);
}
