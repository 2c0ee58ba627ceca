"""Nodes as HAMi's vendor device plugins register them (their register annotation and capacity), for the
scheduler's tests: golden annotations and the tests that place pods on several vendors' devices."""

from __future__ import annotations

from typing import Any

from hami.codec import encode_legacy_register, encode_node_register
from hami.model import Device

__all__ = ["ascend_node", "vendor_node"]


def ascend_node(name: str, count: int = 2) -> dict[str, Any]:
    devices = [
        Device(id=f"{name}-npu-{i}", index=i, count=4, devmem=65536, devcore=20, type="Ascend910B3", numa=0)
        for i in range(count)
    ]
    return {
        "metadata": {"name": name, "annotations": {"hami.io/node-register-Ascend910B3": encode_node_register(devices)}},
        "status": {"capacity": {"huawei.com/Ascend910B3": str(count)}},
    }


def vendor_node(
    name: str,
    register: str,
    capacity: str,
    model: str,
    count: int = 2,
    memory: int = 16384,
    split: int = 4,
    prefix: str = "",
    legacy: bool = False,
) -> dict[str, Any]:
    """A node as a vendor's device plugin registers it (HAMi's register annotation), devices of one model."""
    devices = [
        Device(id=f"{prefix}{name}-{i}", index=i, count=split, devmem=memory, devcore=100, type=model, numa=0)
        for i in range(count)
    ]
    return {
        "metadata": {
            "name": name,
            "annotations": {register: encode_legacy_register(devices) if legacy else encode_node_register(devices)},
        },
        "status": {"capacity": {capacity: str(count * split)}},
    }
