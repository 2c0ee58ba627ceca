/*
 * ascend_types.h: the types of the Ascend API that the fake runtime, the fake AscendCL and the client share: the
 * result codes and the physical-memory properties of both layers (as the real headers lay them out).
 */
#ifndef HAMI_TEST_ASCEND_TYPES_H
#define HAMI_TEST_ASCEND_TYPES_H

#include <stdint.h>

typedef int32_t rtError_t;
typedef int aclError;

struct drv_mem_prop {
    uint32_t side, devid, module_id, pg_type, mem_type;
    uint64_t reserve;
};
struct acl_location {
    uint32_t id;
    int type;
};
struct acl_physical_prop {
    int handle_type, allocation_type, mem_attr;
    struct acl_location location;
    uint64_t reserve;
};

#endif
