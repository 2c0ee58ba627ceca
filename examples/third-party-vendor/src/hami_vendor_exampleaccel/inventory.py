"""Reading the node's ExampleAccel devices: this vendor's "driver binding".

A real vendor asks its driver (NVML, the ACL runtime, ...) which devices the node has; only that vendor's
driver-binding module touches the SDK. ExampleAccel is made up and has no driver, so the node's devices are
listed in a JSON file instead, one object per device:

    {"devices": [
        {"uuid": "EXA-0a1b2c3d-0", "memory": 16384, "model": "ExampleAccel-X1", "numa": 0},
        {"uuid": "EXA-0a1b2c3d-1", "memory": 16384, "healthy": false}
    ]}

`memory` is in MiB; `model` (default ``ExampleAccel``), `numa` (default 0, -1 when unknown) and `healthy`
(default true) are optional. A UUID has the form ``EXA-<serial>-<index>``: the serial names the board and
the index is the device's number on the node, which is also its device file ``/dev/exampleaccel<index>``.
Placements carry only UUIDs, so the node side recovers the device file from the UUID (`uuid_index`)
without reading this file again.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["UUID_FORMAT", "Inventory", "InventoryDevice", "read_inventory", "uuid_index"]

UUID_FORMAT = re.compile(r"^EXA-([0-9A-Za-z]+)-([0-9]+)$")
"""``EXA-<serial>-<index>``: the serial is letters and digits, the index the device's number on the node."""


def uuid_index(uuid: str) -> int:
    """The device index encoded in an ExampleAccel UUID (``EXA-0a1b2c3d-3`` → 3).

    :raises ValueError: the UUID does not have the form ``EXA-<serial>-<index>``.
    """
    match = UUID_FORMAT.match(uuid)
    if match is None:
        raise ValueError(f"{uuid!r} is not an ExampleAccel UUID: expected EXA-<serial>-<index>, e.g. EXA-0a1b2c3d-0")
    return int(match.group(2))


class InventoryDevice(BaseModel):
    """One device of the inventory file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uuid: str = Field(description="EXA-<serial>-<index>")
    memory: int = Field(gt=0, description="device memory in MiB")
    model: str = Field(default="ExampleAccel", min_length=1)
    numa: int = Field(default=0, ge=-1)
    healthy: bool = True

    @field_validator("uuid")
    @classmethod
    def _uuid_format(cls, value: str) -> str:
        uuid_index(value)
        return value

    @property
    def index(self) -> int:
        return uuid_index(self.uuid)


class Inventory(BaseModel):
    """The whole inventory file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    devices: tuple[InventoryDevice, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> Inventory:
        indexes = [d.index for d in self.devices]
        if len(set(indexes)) != len(indexes):
            raise ValueError(f"two devices share an index: {sorted(indexes)}")
        return self


def read_inventory(path: Path) -> Inventory:
    """Read and validate the inventory file.

    :raises FileNotFoundError: there is no file at `path` (no ExampleAccel on this node).
    :raises OSError: the file cannot be read.
    :raises ValueError: the file is not valid JSON or not a valid inventory (pydantic names the bad field).
    """
    return Inventory.model_validate_json(path.read_bytes())
