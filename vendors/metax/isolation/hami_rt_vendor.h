/*
 * hami_rt_vendor.h: what libvmaca.so is, for the core's CUDA-runtime-shaped hook layer (core/src/hami/isolation/rt,
 * which holds every hook). MetaX's MACA runtime is CUDA's runtime under the mc prefix (mcMalloc, mcFree,
 * mcMemGetInfo, mcLaunchKernel, ...; its driver-style entry points such as mcModuleLaunchKernel live in the same
 * library), shipped as libmcruntime.so in /opt/maca/lib (libmxc-runtime64.so in older releases). Assumed from the
 * bindings seen, not from an official header: the CUDA runtime's signatures and error values (mcSuccess 0,
 * mcErrorInvalidValue 1, mcErrorMemoryAllocation 2, mcErrorInitializationError 3, not supported 801); the optional
 * families of HIP (memory pools, mcMemCreate, the Ext and Hcc launches, GetProcAddress) are not assumed. The one
 * optional launch it has is mcLaunchKernelExC (named beside mcLaunchKernel in the bindings seen): its signature and
 * its launch-config struct are inferred from CUDA's cudaLaunchKernelExC(const cudaLaunchConfig_t *config,
 * const void *func, void **args) and cudaLaunchConfig_t (dim3 gridDim; dim3 blockDim; size_t dynamicSmemBytes;
 * the stream; the attributes' pointer; unsigned numAttrs), as mcMallocAsync's is from cudaMallocAsync. Hooked, it
 * keeps a tenant from launching around the compute limit through it. The symbol set is libvmaca.map.
 */
#ifndef HAMI_METAX_RT_VENDOR_H
#define HAMI_METAX_RT_VENDOR_H

#define HAMI_RT(suffix) mc##suffix
#define HAMI_RT_PREFIX "mc"
#define HAMI_RT_VENDOR_NAME "metax"
#define HAMI_RT_LIBRARIES "libmcruntime.so", "/opt/maca/lib/libmcruntime.so", "libmxc-runtime64.so"

#define HAMI_RT_ENV_MEMORY_LIMIT "MACA_DEVICE_MEMORY_LIMIT"
#define HAMI_RT_ENV_CORE_LIMIT "MACA_DEVICE_CORE_LIMIT"
#define HAMI_RT_ENV_SHARED_CACHE "MACA_DEVICE_MEMORY_SHARED_CACHE"
#define HAMI_RT_DEFAULT_CACHE "/tmp/vmacashr.cache"
#define HAMI_RT_ENV_OVERSUBSCRIBE "MACA_OVERSUBSCRIBE"
#define HAMI_RT_ENV_PRIORITY "MACA_TASK_PRIORITY"
#define HAMI_RT_ENV_POLICY "MACA_CORE_UTILIZATION_POLICY"
#define HAMI_RT_ENV_LOG_LEVEL "LIBVMACA_LOG_LEVEL"
#define HAMI_RT_ENV_UUIDS "MACA_DEVICE_UUIDS"

#define HAMI_RT_ERROR_NOT_SUPPORTED 801 /* CUDA's cudaErrorNotSupported; MACA's value not seen */

#define HAMI_RT_HAS_LAUNCH_EXC 1 /* mcLaunchKernelExC, CUDA's signature by parity */

#endif /* HAMI_METAX_RT_VENDOR_H */
