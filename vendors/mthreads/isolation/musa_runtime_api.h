/*
 * musa_runtime_api.h: the MUSA runtime (libmusart.so) declarations libvmusa.so needs, written from MUSA's documented
 * runtime API, the CUDA runtime's mirror under the musa prefix (reference/vendors.md E.3): musaError_t codes
 * (musaSuccess 0, musaErrorInvalidValue 1, musaErrorMemoryAllocation 2, musaErrorInitializationError 3,
 * musaErrorInvalidDevice 101, musaErrorNotReady 600 as CUDA's), dim3, the opaque handle types, and the functions
 * with CUDA runtime's signatures. Numeric values other than 0-3 and 101 are CUDA's, to be checked against
 * musa_runtime_api.h. musaLaunchKernelExC and musaLaunchConfig_t are CUDA's cudaLaunchKernelExC and
 * cudaLaunchConfig_t by the same parity (the fields in CUDA's order; the attributes opaque, as the hook never reads
 * them), not seen in any MUSA header.
 */
#ifndef HAMI_MTHREADS_MUSA_RUNTIME_API_H
#define HAMI_MTHREADS_MUSA_RUNTIME_API_H

#include <stddef.h>

typedef enum musaError {
    musaSuccess = 0,
    musaErrorInvalidValue = 1,
    musaErrorMemoryAllocation = 2,
    musaErrorInitializationError = 3,
    musaErrorInvalidConfiguration = 9,
    musaErrorInvalidDevice = 101,
    musaErrorNotReady = 600,
    musaErrorNotSupported = 801,
    musaErrorSymbolNotFound = 500,
} musaError_t;

typedef struct dim3 {
    unsigned int x, y, z;
} dim3;

typedef struct MUstream_st *musaStream_t;
typedef struct MUevent_st *musaEvent_t;
typedef struct MUmemPoolHandle_st *musaMemPool_t;
typedef struct MUgraphExec_st *musaGraphExec_t;
typedef int musaStreamCaptureStatus; /* musaStreamCaptureStatusNone = 0 */
typedef struct musaLaunchAttribute_st musaLaunchAttribute;

typedef struct musaLaunchConfig_st {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    musaStream_t stream;
    musaLaunchAttribute *attrs;
    unsigned int numAttrs;
} musaLaunchConfig_t;

musaError_t musaGetDeviceCount(int *count);
musaError_t musaSetDevice(int device);
musaError_t musaGetDevice(int *device);
musaError_t musaDeviceSynchronize(void);

musaError_t musaMalloc(void **devPtr, size_t size);
musaError_t musaFree(void *devPtr);
musaError_t musaMallocManaged(void **devPtr, size_t size, unsigned int flags);
musaError_t musaMallocAsync(void **devPtr, size_t size, musaStream_t stream);
musaError_t musaMallocFromPoolAsync(void **ptr, size_t size, musaMemPool_t memPool, musaStream_t stream);
musaError_t musaFreeAsync(void *devPtr, musaStream_t stream);
musaError_t musaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height);
musaError_t musaMemGetInfo(size_t *free, size_t *total);

musaError_t musaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                             musaStream_t stream);
musaError_t musaLaunchKernelExC(const musaLaunchConfig_t *config, const void *func, void **args);
musaError_t musaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                                        musaStream_t stream);
musaError_t musaGraphLaunch(musaGraphExec_t graphExec, musaStream_t stream);

musaError_t musaEventCreate(musaEvent_t *event);
musaError_t musaEventDestroy(musaEvent_t event);
musaError_t musaEventRecord(musaEvent_t event, musaStream_t stream);
musaError_t musaEventQuery(musaEvent_t event);
musaError_t musaEventSynchronize(musaEvent_t event);
musaError_t musaEventElapsedTime(float *ms, musaEvent_t start, musaEvent_t end);
musaError_t musaStreamIsCapturing(musaStream_t stream, musaStreamCaptureStatus *status);

#endif /* HAMI_MTHREADS_MUSA_RUNTIME_API_H */
