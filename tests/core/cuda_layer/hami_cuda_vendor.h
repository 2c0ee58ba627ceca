/*
 * hami_cuda_vendor.h of a scratch vendor for tests/core/test_cuda_layer.py: CUDA's driver API under the prefix mu*
 * (as a MUSA-like driver spells it), no NVML-compatible library, and one hook of the vendor's own (musaMalloc, a
 * runtime function the driver hooks do not see), defined in vendor_hooks.c.
 */
#ifndef TEST_CUDA_VENDOR_H
#define TEST_CUDA_VENDOR_H

#include <stddef.h>

#define HAMI_CU(suffix) mu##suffix
#define HAMI_CUDA_VENDOR_NAME "scratch"
#define HAMI_CUDA_DRIVER_LIBRARIES "libmusa.so.1"
#define HAMI_CUDA_ENV_PREFIX "SCRATCH"

int musaMalloc(void **pointer, size_t bytes);
#define HAMI_CUDA_VENDOR_HOOKS(X) X(musaMalloc)

#endif
