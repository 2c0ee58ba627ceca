/*
 * hami_rt_vendor.h: what libamvgpu.so is, for the core's CUDA-runtime-shaped hook layer (core/src/hami/isolation/rt,
 * which holds every hook). ROCm ships HIP (hip_runtime_api.h's names and signatures) as libamdhip64.so, with the
 * major version in the soname (libamdhip64.so.6 for ROCm 6, libamdhip64.so.7 for ROCm 7). HIP has every optional
 * family of the layer, which hooks each one, including those only some HIP releases have (the Hcc launch of older
 * ones, hipLaunchKernelExC of newer ones): where the installed runtime lacks one its hook answers "not supported",
 * and where it has one no launch goes around the limiter. The variables are HAMi's AMD names
 * (HIP_DEVICE_MEMORY_LIMIT, HIP_DEVICE_MEMORY_SHARED_CACHE, LIBHIP_LOG_LEVEL). The symbol set is libamvgpu.map.
 */
#ifndef HAMI_AMD_RT_VENDOR_H
#define HAMI_AMD_RT_VENDOR_H

#define HAMI_RT(suffix) hip##suffix
#define HAMI_RT_PREFIX "hip"
#define HAMI_RT_VENDOR_NAME "amd"
#define HAMI_RT_LIBRARIES "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so"

#define HAMI_RT_ENV_MEMORY_LIMIT "HIP_DEVICE_MEMORY_LIMIT"
#define HAMI_RT_ENV_CORE_LIMIT "HIP_DEVICE_CORE_LIMIT"
#define HAMI_RT_ENV_SHARED_CACHE "HIP_DEVICE_MEMORY_SHARED_CACHE"
#define HAMI_RT_DEFAULT_CACHE "/tmp/hipdevshr.cache"
#define HAMI_RT_ENV_OVERSUBSCRIBE "HIP_OVERSUBSCRIBE"
#define HAMI_RT_ENV_PRIORITY "HIP_TASK_PRIORITY"
#define HAMI_RT_ENV_POLICY "HIP_CORE_UTILIZATION_POLICY"
#define HAMI_RT_ENV_LOG_LEVEL "LIBHIP_LOG_LEVEL"
#define HAMI_RT_ENV_UUIDS "HIP_DEVICE_UUIDS"

#define HAMI_RT_ERROR_NOT_SUPPORTED 801 /* hipErrorNotSupported */

#define HAMI_RT_HAS_POOL 1
#define HAMI_RT_HAS_VMM 1
#define HAMI_RT_HAS_DEVICE_TOTAL_MEM 1
#define HAMI_RT_HAS_EXT_LAUNCH 1
#define HAMI_RT_HAS_HCC 1
#define HAMI_RT_HAS_MODULE_COOPERATIVE 1
#define HAMI_RT_HAS_LAUNCH_EXC 1
#define HAMI_RT_HAS_PROC_ADDRESS 1

#endif /* HAMI_AMD_RT_VENDOR_H */
