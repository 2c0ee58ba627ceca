/*
 * fake_musart.c: a fake MUSA runtime, built by the tests as libmusart.so and loaded behind libvmusa.so exactly as the
 * real one would be. Written from MUSA's documented runtime API (musa_runtime_api.h of the isolation library:
 * CUDA runtime's signatures under the musa prefix; musaErrorMemoryAllocation 2 when the device is full). It stands
 * for the hardware through hami.testing's fake_device.c with the same FAKE_CUDA_ variables (and so the same shared
 * device state) as the fake driver libmusa.so.1:
 *   - like the real runtime, which reaches the driver through the table muGetExportTable hands it rather than
 *     through the driver's exported mu* symbols, it never calls an mu* function: its traffic is seen by the
 *     isolation library's musa* hooks only;
 *   - like the real runtime may, it calls its own exported functions through the global scope (no -Bsymbolic):
 *     musaMallocManaged is musaMalloc underneath and musaMemGetInfo asks musaGetDevice, which the isolation library
 *     must not count twice;
 *   - a kernel "runs" for FAKE_CUDA_KERNEL_NS plus FAKE_CUDA_KERNEL_NS_PER_BLOCK x its blocks; events are
 *     timestamps on the device's timeline;
 *   - musaLaunchKernelExC (cudaLaunchKernelExC's shape by the mirror parity) runs its config's grid as
 *     musaLaunchKernel runs its own; a NULL config is answered with musaErrorInvalidConfiguration (9), a code the
 *     isolation library never gives itself, so a test sees that the runtime answered.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>

#include "fake_device.h"
#include "musa_runtime_api.h"

#define EXPORT __attribute__((visibility("default")))

struct MUevent_st {
    uint64_t t;
    int recorded;
};

static __thread int t_device = 0;

/* The driver fake's variables and default size, so that both see one device. */
__attribute__((constructor)) static void fake_load(void) { fake_device_load("FAKE_CUDA_", 16ull << 30); }

EXPORT musaError_t musaGetDeviceCount(int *count) {
    if (!count) return musaErrorInvalidValue;
    *count = fake.devices;
    return musaSuccess;
}

EXPORT musaError_t musaSetDevice(int device) {
    if (device < 0 || device >= fake.devices) return musaErrorInvalidDevice;
    t_device = device;
    return musaSuccess;
}

EXPORT musaError_t musaGetDevice(int *device) {
    if (!device) return musaErrorInvalidValue;
    *device = t_device;
    return musaSuccess;
}

EXPORT musaError_t musaDeviceSynchronize(void) {
    fake_synchronize();
    return musaSuccess;
}

static musaError_t device_alloc(void **p, size_t size) {
    if (!p) return musaErrorInvalidValue;
    if (!size) {
        *p = NULL;
        return musaSuccess;
    }
    void *b = fake_alloc(t_device, size, 1);
    if (!b) return musaErrorMemoryAllocation;
    *p = b;
    return musaSuccess;
}

static musaError_t device_free(void *p) { return !p ? musaSuccess : fake_free(p) ? musaSuccess : musaErrorInvalidValue; }

EXPORT musaError_t musaMalloc(void **p, size_t size) { return device_alloc(p, size); }
EXPORT musaError_t musaFree(void *p) { return device_free(p); }
EXPORT musaError_t musaMallocManaged(void **p, size_t size, unsigned int flags) {
    (void)flags;
    return musaMalloc(p, size); /* through the PLT, as the runtime's internal calls may go */
}
EXPORT musaError_t musaMallocAsync(void **p, size_t size, musaStream_t stream) {
    (void)stream;
    return device_alloc(p, size);
}
EXPORT musaError_t musaMallocFromPoolAsync(void **p, size_t size, musaMemPool_t pool, musaStream_t stream) {
    (void)pool, (void)stream;
    return device_alloc(p, size);
}
EXPORT musaError_t musaFreeAsync(void *p, musaStream_t stream) {
    (void)stream;
    return device_free(p);
}
EXPORT musaError_t musaMallocPitch(void **p, size_t *pitch, size_t width, size_t height) {
    if (!p || !pitch) return musaErrorInvalidValue;
    size_t padded = (width + 511) / 512 * 512;
    musaError_t r = device_alloc(p, padded * height);
    if (r == musaSuccess) *pitch = padded;
    return r;
}

EXPORT musaError_t musaMemGetInfo(size_t *free, size_t *total) {
    if (!free || !total) return musaErrorInvalidValue;
    int device = 0;
    musaError_t r = musaGetDevice(&device); /* through the PLT */
    if (r != musaSuccess) return r;
    uint64_t used = fake_used(device);
    *total = fake.memory;
    *free = used > fake.memory ? 0 : fake.memory - used;
    return musaSuccess;
}

EXPORT musaError_t musaEventCreate(musaEvent_t *e) {
    if (!e) return musaErrorInvalidValue;
    *e = calloc(1, sizeof **e);
    return *e ? musaSuccess : musaErrorMemoryAllocation;
}
EXPORT musaError_t musaEventDestroy(musaEvent_t e) {
    free(e);
    return musaSuccess;
}
EXPORT musaError_t musaEventRecord(musaEvent_t e, musaStream_t stream) {
    (void)stream;
    if (!e) return musaErrorInvalidValue;
    e->t = fake_reached(t_device);
    e->recorded = 1;
    return musaSuccess;
}
EXPORT musaError_t musaEventQuery(musaEvent_t e) {
    if (!e) return musaErrorInvalidValue;
    return fake_now_ns() >= e->t ? musaSuccess : musaErrorNotReady;
}
EXPORT musaError_t musaEventSynchronize(musaEvent_t e) {
    if (!e) return musaErrorInvalidValue;
    fake_sleep_until(e->t);
    return musaSuccess;
}
EXPORT musaError_t musaEventElapsedTime(float *ms, musaEvent_t a, musaEvent_t b) {
    if (!ms || !a || !b || !a->recorded || !b->recorded) return musaErrorInvalidValue;
    if (fake_now_ns() < a->t || fake_now_ns() < b->t) return musaErrorNotReady;
    *ms = (float)(((double)b->t - (double)a->t) / 1e6);
    return musaSuccess;
}
EXPORT musaError_t musaStreamIsCapturing(musaStream_t stream, musaStreamCaptureStatus *status) {
    (void)stream;
    if (!status) return musaErrorInvalidValue;
    *status = 0;
    return musaSuccess;
}

static musaError_t run(const void *f, uint64_t blocks) {
    if (!f) return musaErrorInvalidValue;
    fake_run(t_device, fake_kernel_ns(blocks));
    return musaSuccess;
}

EXPORT musaError_t musaLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shared, musaStream_t s) {
    (void)block, (void)args, (void)shared, (void)s;
    return run(f, (uint64_t)grid.x * grid.y * grid.z);
}
EXPORT musaError_t musaLaunchKernelExC(const musaLaunchConfig_t *config, const void *f, void **args) {
    (void)args;
    if (!config) return musaErrorInvalidConfiguration;
    return run(f, (uint64_t)config->gridDim.x * config->gridDim.y * config->gridDim.z);
}
EXPORT musaError_t musaLaunchCooperativeKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shared,
                                               musaStream_t s) {
    return musaLaunchKernel(f, grid, block, args, shared, s); /* through the PLT */
}
EXPORT musaError_t musaGraphLaunch(musaGraphExec_t graph, musaStream_t s) {
    (void)s;
    return run(graph, 1);
}
