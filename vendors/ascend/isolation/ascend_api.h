/*
 * ascend_api.h: the AscendCL (libascendcl.so) and runtime (libruntime.so) declarations libvnpu.so needs, written
 * from the documented API (CANN's acl_rt.h, acl_base.h, rt_error_codes.h, runtime/kernel.h, runtime/mem.h): the
 * types, the constants, and the signatures of the functions it intercepts or calls. Only what the library touches
 * is declared; argument structures it passes through untouched stay opaque.
 */
#ifndef HAMI_ASCEND_API_H
#define HAMI_ASCEND_API_H

#include <stddef.h>
#include <stdint.h>

/* ---- errors (acl_base.h, rt_error_codes.h) ------------------------------------------------------------ */

typedef int aclError;
typedef int32_t rtError_t;

#define ACL_SUCCESS 0
#define RT_ERROR_NONE 0
#define ACL_ERROR_RT_FEATURE_NOT_SUPPORT 207000 /* the installed runtime lacks the function */
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001   /* out of device memory: what an over-limit allocation answers */
#define ACL_ERROR_RT_INTERNAL_ERROR 507000      /* the runtime library cannot be loaded */

/* ---- handles -------------------------------------------------------------------------------------------- */

typedef void *rtStream_t;
typedef void *rtEvent_t;
typedef void *rtModel_t;
typedef void *rtContext_t;
typedef void *rtDrvMemHandle;
typedef struct rtSmDesc rtSmDesc_t;
typedef struct rtArgsEx rtArgsEx_t;
typedef struct rtTaskCfgInfo rtTaskCfgInfo_t;
typedef struct rtAicpuArgsEx rtAicpuArgsEx_t;
typedef struct rtKernelLaunchNames rtKernelLaunchNames_t;

typedef void *aclrtStream;
typedef void *aclrtContext;
typedef void *aclrtDrvMemHandle;
typedef void *aclrtFuncHandle;
typedef void *aclrtArgsHandle;
typedef struct aclrtLaunchKernelCfg aclrtLaunchKernelCfg;
typedef struct aclTensorDesc aclTensorDesc;
typedef struct aclDataBuffer aclDataBuffer;
typedef struct aclopAttr aclopAttr;
typedef struct aclmdlDataset aclmdlDataset;

/* ---- memory (runtime/mem.h, acl_rt.h) -------------------------------------------------------------------- */

/* rtMalloc's memory type: the low byte says where; bit 7 set (RT_MEMORY_HOST 0x81, RT_MEMORY_SVM 0x90) is host
 * memory, not counted. Policy bits (huge pages, ...) sit above the low byte. */
typedef uint32_t rtMemType_t;
#define RT_MEMORY_HOST_BIT 0x80u

/* rtMemGetInfoEx's and aclrtGetMemInfo's memory kinds (same numbering): DDR 0, HBM 1, then huge/normal and P2P
 * variants. All of them describe the device's memory, so all of them answer the container's view. */
typedef int rtMemInfoType_t;
typedef int aclrtMemAttr;
typedef int aclrtMemMallocPolicy;

/* rtMallocPhysical's property (the driver's drv_mem_prop): side MEM_DEV_SIDE (1) is device memory on `devid`. */
typedef struct rtDrvMemProp {
    uint32_t side;
    uint32_t devid;
    uint32_t module_id;
    uint32_t pg_type;
    uint32_t mem_type;
    uint64_t reserve;
} rtDrvMemProp_t;
#define RT_MEM_DEV_SIDE 1u

/* aclrtMallocPhysical's property: location.type ACL_MEM_LOCATION_TYPE_DEVICE (1) is device memory on location.id. */
typedef struct aclrtMemLocation {
    uint32_t id;
    int type;
} aclrtMemLocation;
typedef struct aclrtPhysicalMemProp {
    int handleType;
    int allocationType;
    aclrtMemAttr memAttr;
    aclrtMemLocation location;
    uint64_t reserve;
} aclrtPhysicalMemProp;
#define ACL_MEM_LOCATION_TYPE_DEVICE 1

rtError_t rtMalloc(void **devPtr, uint64_t size, rtMemType_t type, uint16_t moduleId);
rtError_t rtFree(void *devPtr);
rtError_t rtMallocPhysical(rtDrvMemHandle *handle, size_t size, rtDrvMemProp_t *prop, uint64_t flags);
rtError_t rtFreePhysical(rtDrvMemHandle handle);
rtError_t rtMemGetInfoEx(rtMemInfoType_t memInfoType, size_t *free, size_t *total);
rtError_t rtMemGetInfo(size_t *free, size_t *total);

aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtMallocAlign32(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtMallocCached(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtFree(void *devPtr);
aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop, uint64_t flags);
aclError aclrtFreePhysical(aclrtDrvMemHandle handle);
aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total);

/* ---- devices -------------------------------------------------------------------------------------------- */

rtError_t rtSetDevice(int32_t devId);
rtError_t rtGetDevice(int32_t *devId);
rtError_t rtGetDeviceCount(int32_t *count);
rtError_t rtCtxSetCurrent(rtContext_t ctx);

aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtSetCurrentContext(aclrtContext context);

/* ---- launches and execution (runtime/kernel.h, acl_rt.h, acl_op.h, acl_mdl.h; CANN 7+ signatures) ---------- */

rtError_t rtKernelLaunch(const void *stubFunc, uint32_t blockDim, void *args, uint32_t argsSize, rtSmDesc_t *smDesc,
                         rtStream_t stm);
rtError_t rtKernelLaunchWithFlagV2(const void *stubFunc, uint32_t blockDim, rtArgsEx_t *argsInfo, rtSmDesc_t *smDesc,
                                   rtStream_t stm, uint32_t flags, const rtTaskCfgInfo_t *cfgInfo);
rtError_t rtKernelLaunchWithHandleV2(void *hdl, const uint64_t tilingKey, uint32_t blockDim, rtArgsEx_t *argsInfo,
                                     rtSmDesc_t *smDesc, rtStream_t stm, const rtTaskCfgInfo_t *cfgInfo);
rtError_t rtAicpuKernelLaunchExWithArgs(const uint32_t kernelType, const char *const opName, const uint32_t blockDim,
                                        const rtAicpuArgsEx_t *argsInfo, rtSmDesc_t *const smDesc,
                                        const rtStream_t stm, const uint32_t flags);
rtError_t rtAicpuKernelLaunchWithFlag(const rtKernelLaunchNames_t *launchNames, uint32_t blockDim,
                                      const rtArgsEx_t *argsInfo, rtSmDesc_t *smDesc, rtStream_t stm, uint32_t flags);
rtError_t rtModelExecute(rtModel_t mdl, rtStream_t stm, uint32_t flag);

aclError aclrtLaunchKernel(aclrtFuncHandle funcHandle, uint32_t numBlocks, const void *argsData, size_t argsSize,
                           aclrtStream stream);
aclError aclrtLaunchKernelWithConfig(aclrtFuncHandle funcHandle, uint32_t numBlocks, aclrtStream stream,
                                     aclrtLaunchKernelCfg *cfg, aclrtArgsHandle argsHandle, void *reserve);
aclError aclopExecuteV2(const char *opType, int numInputs, aclTensorDesc *inputDesc[], aclDataBuffer *inputs[],
                        int numOutputs, aclTensorDesc *outputDesc[], aclDataBuffer *outputs[], aclopAttr *attr,
                        aclrtStream stream);
aclError aclmdlExecute(uint32_t modelId, const aclmdlDataset *input, aclmdlDataset *output);
aclError aclmdlExecuteAsync(uint32_t modelId, const aclmdlDataset *input, aclmdlDataset *output, aclrtStream stream);

/* ---- events (runtime/event.h) ---------------------------------------------------------------------------- */

rtError_t rtEventCreate(rtEvent_t *evt);
rtError_t rtEventRecord(rtEvent_t evt, rtStream_t stm);
rtError_t rtEventQuery(rtEvent_t evt); /* RT_ERROR_NONE once the device passed it */
rtError_t rtEventSynchronize(rtEvent_t evt);
rtError_t rtEventElapsedTime(float *timeInterval, rtEvent_t startEvent, rtEvent_t endEvent); /* milliseconds */
rtError_t rtEventDestroy(rtEvent_t evt);

#endif /* HAMI_ASCEND_API_H */
