/*
 * fake_cnrt.c: a fake CNRT, built by the tests as libcnrt.so over the fake libcndrv.so, loaded behind libvmlu.so as
 * the real one would be. Written from CNRT's documented API (cnrt.h, CNRT 6.x: signatures and cnrtRet_t codes:
 * cnrtErrorNoMem 100100, cnrtErrorArgsInvalid 100006, cnrtErrorNotReady 1). Like the real CNRT it is built on CNDrv:
 * cnrtMalloc is cnMalloc, cnrtFree reaches cnFree through cnGetExportFunction, cnrtMemGetInfo is cnMemGetInfo,
 * cnrtDeviceGetAttribute's cnrtAttrTotalMemSize is cnDeviceTotalMem in MB and cnrtInvokeKernel is cnInvokeKernel
 * (all through the global scope, where the preloaded libvmlu.so comes first: what the isolation library must not
 * count twice, nor cut twice). Notifiers are timestamps on the fake device's timeline (the
 * moment the device gets past them); cnrtSyncDevice waits for the process's work.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>

#include "cn_api.h"

#define EXPORT __attribute__((visibility("default")))

/* the fake CNDrv's link to the fake device (fake_cndrv.c) */
void fake_cndrv_use_device(int device);
int fake_cndrv_device_count(void);
uint64_t fake_cndrv_reached(void);
uint64_t fake_cndrv_now_ns(void);
void fake_cndrv_sleep_until(uint64_t t);
void fake_cndrv_synchronize(void);

struct cnrtNotifier_st {
    uint64_t t;
    int placed;
};

static __thread int t_device = 0;

static cnrtRet_t from_cn(CNresult r) {
    switch (r) {
    case CN_SUCCESS: return cnrtSuccess;
    case CN_MEMORY_ERROR_OUT_OF_MEMORY: return cnrtErrorNoMem;
    default: return cnrtErrorArgsInvalid;
    }
}

EXPORT cnrtRet_t cnrtGetDeviceCount(unsigned int *count) {
    if (!count) return cnrtErrorArgsInvalid;
    int n = 0;
    CNresult r = cnDeviceGetCount(&n);
    *count = (unsigned int)n;
    return from_cn(r);
}

EXPORT cnrtRet_t cnrtSetDevice(int ordinal) {
    if (ordinal < 0 || ordinal >= fake_cndrv_device_count()) return cnrtErrorArgsInvalid;
    t_device = ordinal;
    fake_cndrv_use_device(ordinal);
    return cnrtSuccess;
}

EXPORT cnrtRet_t cnrtGetDevice(int *ordinal) {
    if (!ordinal) return cnrtErrorArgsInvalid;
    *ordinal = t_device;
    return cnrtSuccess;
}

EXPORT cnrtRet_t cnrtMalloc(void **p, size_t bytes) {
    if (!p) return cnrtErrorArgsInvalid;
    CNaddr a = 0;
    CNresult r = cnMalloc(&a, bytes);
    *p = (void *)(uintptr_t)a;
    return from_cn(r);
}

EXPORT cnrtRet_t cnrtFree(void *p) {
    const void *f = NULL;
    if (cnGetExportFunction("cnFree", &f) != CN_SUCCESS || !f) return cnrtErrorArgsInvalid;
    return from_cn(((CNresult(*)(CNaddr))f)((CNaddr)(uintptr_t)p));
}

EXPORT cnrtRet_t cnrtMemGetInfo(size_t *free, size_t *total) {
    if (!free || !total) return cnrtErrorArgsInvalid;
    cn_uint64_t f = 0, t = 0;
    CNresult r = cnMemGetInfo(&f, &t);
    *free = (size_t)f;
    *total = (size_t)t;
    return from_cn(r);
}

/* Two attributes: cnrtAttrTotalMemSize (MB, from CNDrv) and cnrtAttrGmemBusWidth (a fixed 4096 bits). */
EXPORT cnrtRet_t cnrtDeviceGetAttribute(int *value, cnrtDeviceAttr_t attr, int device) {
    if (!value || device < 0 || device >= fake_cndrv_device_count()) return cnrtErrorArgsInvalid;
    if (attr == cnrtAttrGmemBusWidth) {
        *value = 4096;
        return cnrtSuccess;
    }
    if (attr != cnrtAttrTotalMemSize) return cnrtErrorNotSupport;
    cn_uint64_t bytes = 0;
    CNresult r = cnDeviceTotalMem(&bytes, (CNdev)device);
    if (r == CN_SUCCESS) *value = (int)(bytes >> 20);
    return from_cn(r);
}

EXPORT cnrtRet_t cnrtInvokeKernel(const void *kernel, cnrtDim3_t dim, cnrtFunctionType_t ktype, void **args,
                                  size_t reserved, cnrtQueue_t queue) {
    (void)reserved;
    return from_cn(cnInvokeKernel((CNkernel)(uintptr_t)kernel, dim.x, dim.y, dim.z, ktype, 0, queue, args, NULL));
}

EXPORT cnrtRet_t cnrtSyncDevice(void) {
    fake_cndrv_synchronize();
    return cnrtSuccess;
}

EXPORT cnrtRet_t cnrtNotifierCreate(cnrtNotifier_t *n) {
    if (!n) return cnrtErrorArgsInvalid;
    *n = calloc(1, sizeof **n);
    return *n ? cnrtSuccess : cnrtErrorNoMem;
}

EXPORT cnrtRet_t cnrtNotifierDestroy(cnrtNotifier_t n) {
    free(n);
    return cnrtSuccess;
}

EXPORT cnrtRet_t cnrtPlaceNotifier(cnrtNotifier_t n, cnrtQueue_t queue) {
    (void)queue;
    if (!n) return cnrtErrorArgsInvalid;
    n->t = fake_cndrv_reached();
    n->placed = 1;
    return cnrtSuccess;
}

EXPORT cnrtRet_t cnrtQueryNotifier(cnrtNotifier_t n) {
    if (!n) return cnrtErrorArgsInvalid;
    return fake_cndrv_now_ns() >= n->t ? cnrtSuccess : cnrtErrorNotReady;
}

EXPORT cnrtRet_t cnrtWaitNotifier(cnrtNotifier_t n) {
    if (!n) return cnrtErrorArgsInvalid;
    fake_cndrv_sleep_until(n->t);
    return cnrtSuccess;
}

EXPORT cnrtRet_t cnrtNotifierElapsedTime(cnrtNotifier_t a, cnrtNotifier_t b, float *ms) {
    if (!ms || !a || !b || !a->placed || !b->placed) return cnrtErrorArgsInvalid;
    if (fake_cndrv_now_ns() < a->t || fake_cndrv_now_ns() < b->t) return cnrtErrorNotReady;
    *ms = (float)(((double)b->t - (double)a->t) / 1e6);
    return cnrtSuccess;
}
