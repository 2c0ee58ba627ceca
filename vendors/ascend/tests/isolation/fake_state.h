/*
 * fake_state.h: what the fake runtime (fake_runtime.c, libruntime.so) shares between all the processes of a test,
 * in the file named by FAKE_NPU_STATE (the test creates it, zero-filled, FAKE_STATE_SIZE bytes; conftest.py reads
 * it with the same offsets). Without FAKE_NPU_STATE each process has its own. This is the "hardware": what is
 * really allocated on each device, and a timeline of device work.
 */
#ifndef FAKE_NPU_STATE_H
#define FAKE_NPU_STATE_H

#include <stdatomic.h>
#include <stdint.h>

#define FAKE_MAX_DEVICES 8
#define FAKE_TAGS 8
#define FAKE_STATE_SIZE 4096

struct fake_device_state {                   /* 256 bytes */
    _Atomic uint64_t allocated;              /*   0: bytes really allocated now, by every process */
    _Atomic uint64_t peak;                   /*   8: highest `allocated` ever */
    _Atomic uint64_t busy_until;             /*  16: CLOCK_MONOTONIC ns at which queued work ends */
    _Atomic uint64_t launches;               /*  24: launches that ran for a time */
    _Atomic uint64_t busy_ns[FAKE_TAGS];     /*  32: device time of launches, by FAKE_NPU_TAG of the launcher */
    _Atomic uint64_t allocations;            /*  96: successful device allocations */
    _Atomic uint64_t host_allocations;       /* 104: host allocations (never counted as device memory) */
    uint8_t pad[144];
};

struct fake_state {
    uint8_t header[256];
    struct fake_device_state devices[FAKE_MAX_DEVICES]; /* at 256 */
};

_Static_assert(sizeof(struct fake_device_state) == 256, "fake device state is 256 bytes");
_Static_assert(sizeof(struct fake_state) <= FAKE_STATE_SIZE, "fits the file");

#endif
