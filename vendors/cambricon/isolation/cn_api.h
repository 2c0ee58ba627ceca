/*
 * cn_api.h: the part of Cambricon's CNDrv (cn_api.h, CNDrv 2.15) and CNRT (cnrt.h, CNRT 6.x) interfaces that
 * libvmlu.so hooks or calls, restated from the documented declarations (reference/vendors.md B.2-B.3): the types,
 * the return codes used, and the prototypes. Opaque handles are pointers to incomplete structs, as in the headers.
 */
#ifndef HAMI_CAMBRICON_CN_API_H
#define HAMI_CAMBRICON_CN_API_H

#include <stddef.h>
#include <stdint.h>

typedef uint64_t cn_uint64_t;
typedef cn_uint64_t CNaddr;
typedef cn_uint64_t CNdev;
typedef cn_uint64_t CNmemGenericAllocationHandle; /* assumed 64-bit, as CUDA's (verify on a real CNDrv) */
typedef struct CNqueue_st *CNqueue;
typedef struct CNkernel_st *CNkernel;
typedef struct CNmemoryPool_st *CNmemoryPool;
typedef struct CNinvokeConfig_st CNinvokeConfig; /* passed through by pointer, never read */
typedef struct CNmemAllocationProp_st CNmemAllocationProp;
typedef int KernelClass;

typedef enum {
    CN_SUCCESS = 0,
    CN_ERROR_NOT_READY = 1,
    CN_ERROR_NOT_INITIALIZED = 100002,
    CN_ERROR_INVALID_DEVICE = 100005,
    CN_ERROR_INVALID_VALUE = 100006,
    CN_OPS_ERROR_NOT_SUPPORTED = 100050,
    CN_MEMORY_ERROR_OUT_OF_MEMORY = 100100,
    CN_MEMORY_ERROR_INVALID_ADDRESS = 100102,
    CN_ERROR_NOT_FOUND = 100301,
} CNresult;

typedef enum {
    cnrtSuccess = 0,
    cnrtErrorNotReady = 1,
    cnrtErrorInit = 100002,
    cnrtErrorArgsInvalid = 100006,
    cnrtErrorNotSupport = 100050,
    cnrtErrorNoMem = 100100,
} cnrtRet_t;

typedef struct {
    unsigned int x, y, z;
} cnrtDim3_t;
typedef int cnrtFunctionType_t;
/* The device attributes libvmlu.so reads (cnrtDeviceAttr_t); every other value is passed through unread. */
typedef enum {
    cnrtAttrGmemBusWidth = 0x404,
    cnrtAttrTotalMemSize = 0x405, /* the maximum available memory, in MB */
} cnrtDeviceAttr_t;
typedef struct CNqueue_st *cnrtQueue_t; /* CNRT's queue is CNDrv's (CNRT is built on CNDrv) */
typedef struct cnrtNotifier_st *cnrtNotifier_t;

/* CNDrv */
CNresult cnDeviceGetCount(int *count);
CNresult cnCtxGetDevice(CNdev *pdev);
CNresult cnMalloc(CNaddr *pmluAddr, cn_uint64_t bytes);
CNresult cnMallocSecurity(CNaddr *pmluAddr, cn_uint64_t bytes);
CNresult cnMallocNode(CNaddr *pmluAddr, cn_uint64_t bytes, int node);
CNresult cnZmalloc(CNaddr *pmluAddr, cn_uint64_t bytes);
CNresult cnZmallocNode(CNaddr *pmluAddr, cn_uint64_t bytes, int node);
CNresult cnMallocConstant(CNaddr *pmluAddr, cn_uint64_t bytes);
CNresult cnMallocNodeConstant(CNaddr *pmluAddr, cn_uint64_t bytes, int node);
CNresult cnMallocFrameBuffer(CNaddr *pmluAddr, cn_uint64_t bytes, int node);
CNresult cnMallocPeerAble(CNaddr *pmluAddr, cn_uint64_t bytes);
CNresult cnFree(CNaddr mluAddr);
CNresult cnMemAllocAsync(CNaddr *mluAddr, size_t byteSize, CNqueue queue);
CNresult cnMemAllocFromPoolAsync(CNaddr *mluAddr, size_t byteSize, CNmemoryPool pool, CNqueue queue);
CNresult cnMemFreeAsync(CNaddr mluAddr, CNqueue queue);
CNresult cnMemCreate(CNmemGenericAllocationHandle *phandle, cn_uint64_t size, CNmemAllocationProp *prop,
                     cn_uint64_t flags);
CNresult cnMemRelease(CNmemGenericAllocationHandle handle);
CNresult cnMemGetInfo(cn_uint64_t *pfreeBytes, cn_uint64_t *ptotalBytes);
CNresult cnMemGetNodeInfo(cn_uint64_t *pfreeBytes, cn_uint64_t *ptotalBytes, int node);
CNresult cnDeviceTotalMem(cn_uint64_t *pbytes, CNdev dev);
CNresult cnInvokeKernel(CNkernel hkernel, unsigned int dimx, unsigned int dimy, unsigned int dimz, KernelClass c,
                        unsigned int reserve, CNqueue hqueue, void **kernelParams, void **extra);
CNresult cnInvokeKernelEx(const CNinvokeConfig *config, CNkernel hkernel, void **kernelParams, void **extra);
CNresult cnGetExportFunction(const char *name, const void **func);

/* CNRT */
cnrtRet_t cnrtGetDevice(int *pOrdinal);
cnrtRet_t cnrtSetDevice(int ordinal);
cnrtRet_t cnrtGetDeviceCount(unsigned int *pCount);
cnrtRet_t cnrtMalloc(void **pPtr, size_t bytes);
cnrtRet_t cnrtFree(void *ptr);
cnrtRet_t cnrtMemGetInfo(size_t *free, size_t *total);
cnrtRet_t cnrtDeviceGetAttribute(int *pValue, cnrtDeviceAttr_t attr, int device);
cnrtRet_t cnrtInvokeKernel(const void *kernel, cnrtDim3_t dim, cnrtFunctionType_t ktype, void **args, size_t reserved,
                           cnrtQueue_t queue);
cnrtRet_t cnrtNotifierCreate(cnrtNotifier_t *pNotifier);
cnrtRet_t cnrtNotifierDestroy(cnrtNotifier_t notifier);
cnrtRet_t cnrtPlaceNotifier(cnrtNotifier_t notifier, cnrtQueue_t queue);
cnrtRet_t cnrtQueryNotifier(cnrtNotifier_t notifier);
cnrtRet_t cnrtWaitNotifier(cnrtNotifier_t notifier);
cnrtRet_t cnrtNotifierElapsedTime(cnrtNotifier_t start, cnrtNotifier_t end, float *ms);
cnrtRet_t cnrtSyncDevice(void);

#endif /* HAMI_CAMBRICON_CN_API_H */
