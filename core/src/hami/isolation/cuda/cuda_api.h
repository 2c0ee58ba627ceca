/*
 * cuda_api.h: the part of the CUDA driver API and NVML that the CUDA-compatible hook layer touches, declared from
 * the published facts (types, values and signatures of the documented API; no vendor header is needed to build).
 * Functions are named through HAMI_CU (hami_cuda.h), so a driver with CUDA's API under another prefix uses them too.
 * Only what is hooked or called is here. Keep values exactly as the driver defines them.
 */
#ifndef HAMI_CUDA_API_H
#define HAMI_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

/* ---- CUDA driver API ---------------------------------------------------------------------------------- */

typedef int CUresult;
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
};

typedef int CUdevice;
typedef unsigned long long CUdeviceptr; /* CUdeviceptr_v2: pointer-sized on 64-bit platforms */
typedef unsigned long long cuuint64_t;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUfunc_st *CUfunction;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUgraphExec_st *CUgraphExec;

#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

enum { CU_EVENT_DEFAULT = 0 };

typedef enum {
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
} CUstreamCaptureStatus;

/* cuGetProcAddress flags and results */
enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1,
};
typedef enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

/* Arrays */
typedef int CUarray_format;
typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;
enum { CUDA_ARRAY3D_LAYERED = 0x01, CUDA_ARRAY3D_CUBEMAP = 0x04 };

/* Virtual memory management and pools */
typedef enum { CU_MEM_LOCATION_TYPE_INVALID = 0, CU_MEM_LOCATION_TYPE_DEVICE = 1 } CUmemLocationType;
typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;
typedef struct CUmemAllocationProp_st {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct CUmemPoolProps_st {
    int allocType;
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

/* Launches */
typedef struct CUlaunchAttribute_st CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* Contexts (only passed through) */
typedef struct CUexecAffinityParam_st CUexecAffinityParam;
typedef struct CUctxCreateParams_st CUctxCreateParams;

/* Hooked */
CUresult HAMI_CU(Init)(unsigned int flags);
CUresult HAMI_CU(GetProcAddress)(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult HAMI_CU(GetProcAddress_v2)(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus);
CUresult HAMI_CU(MemAlloc_v2)(CUdeviceptr *dptr, size_t bytesize);
CUresult HAMI_CU(MemAllocPitch_v2)(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes);
CUresult HAMI_CU(MemAllocManaged)(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult HAMI_CU(MemFree_v2)(CUdeviceptr dptr);
CUresult HAMI_CU(MemCreate)(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags);
CUresult HAMI_CU(MemRelease)(CUmemGenericAllocationHandle handle);
CUresult HAMI_CU(MemAllocAsync)(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult HAMI_CU(MemAllocAsync_ptsz)(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult HAMI_CU(MemFreeAsync)(CUdeviceptr dptr, CUstream hStream);
CUresult HAMI_CU(MemFreeAsync_ptsz)(CUdeviceptr dptr, CUstream hStream);
CUresult HAMI_CU(MemAllocFromPoolAsync)(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult HAMI_CU(MemAllocFromPoolAsync_ptsz)(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult HAMI_CU(MemPoolCreate)(CUmemoryPool *pool, const CUmemPoolProps *poolProps);
CUresult HAMI_CU(MemPoolDestroy)(CUmemoryPool pool);
CUresult HAMI_CU(ArrayCreate_v2)(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray);
CUresult HAMI_CU(Array3DCreate_v2)(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray);
CUresult HAMI_CU(ArrayDestroy)(CUarray hArray);
CUresult HAMI_CU(MipmappedArrayCreate)(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                unsigned int numMipmapLevels);
CUresult HAMI_CU(MipmappedArrayDestroy)(CUmipmappedArray hMipmappedArray);
CUresult HAMI_CU(MemGetInfo_v2)(size_t *free, size_t *total);
CUresult HAMI_CU(DeviceTotalMem_v2)(size_t *bytes, CUdevice dev);
CUresult HAMI_CU(LaunchKernel)(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
CUresult HAMI_CU(LaunchKernel_ptsz)(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
CUresult HAMI_CU(LaunchKernelEx)(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);
CUresult HAMI_CU(LaunchKernelEx_ptsz)(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);
CUresult HAMI_CU(LaunchCooperativeKernel)(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams);
CUresult HAMI_CU(LaunchCooperativeKernel_ptsz)(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams);
CUresult HAMI_CU(GraphLaunch)(CUgraphExec hGraphExec, CUstream hStream);
CUresult HAMI_CU(GraphLaunch_ptsz)(CUgraphExec hGraphExec, CUstream hStream);
CUresult HAMI_CU(CtxCreate_v2)(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult HAMI_CU(CtxCreate_v3)(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                        CUdevice dev);
CUresult HAMI_CU(CtxCreate_v4)(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev);
CUresult HAMI_CU(CtxDestroy_v2)(CUcontext ctx);
CUresult HAMI_CU(CtxSetCurrent)(CUcontext ctx);
CUresult HAMI_CU(CtxPushCurrent_v2)(CUcontext ctx);
CUresult HAMI_CU(CtxPopCurrent_v2)(CUcontext *pctx);
CUresult HAMI_CU(DevicePrimaryCtxRetain)(CUcontext *pctx, CUdevice dev);
CUresult HAMI_CU(DevicePrimaryCtxReset_v2)(CUdevice dev);

/* Called, not hooked */
CUresult HAMI_CU(DeviceGetCount)(int *count);
CUresult HAMI_CU(CtxGetCurrent)(CUcontext *pctx);
CUresult HAMI_CU(CtxGetDevice)(CUdevice *device);
CUresult HAMI_CU(EventCreate)(CUevent *phEvent, unsigned int Flags);
CUresult HAMI_CU(EventRecord)(CUevent hEvent, CUstream hStream);
CUresult HAMI_CU(EventQuery)(CUevent hEvent);
CUresult HAMI_CU(EventElapsedTime)(float *pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult HAMI_CU(EventSynchronize)(CUevent hEvent);
CUresult HAMI_CU(EventDestroy_v2)(CUevent hEvent);
CUresult HAMI_CU(StreamIsCapturing)(CUstream hStream, CUstreamCaptureStatus *captureStatus);

/* ---- NVML ------------------------------------------------------------------------------------------------ */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
};
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;
typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index);

/* Per-process utilization (Maxwell and later): one sample per process that used the device since
 * lastSeenTimeStamp, a CPU timestamp in microseconds (0: everything the driver's sample buffer holds). */
typedef struct nvmlProcessUtilizationSample_st {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;
/* Processes with a context on the device and the memory the driver counts for each (NVML's first record; the
 * function every NVML-compatible library has). usedGpuMemory is ~0 when NVML cannot tell (Windows' WDDM). */
typedef struct nvmlProcessInfo_v1_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos);
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp);

#endif /* HAMI_CUDA_API_H */
