"""What the node daemons measured, as the scheduler reads it: each device's busy share on the Node.

Owns the node annotation `hami.io/node-device-busy`: `<device id>:<busy percent>` entries joined by commas
(`GPU-a:92,GPU-b:0`), one per device whose busy share the node daemon knows (from the vendor's readings, else the
sum of its containers' shares as their isolation libraries account them); a device absent from it is unknown.
The node daemon writes it (`hami.node.busy`), the `usage` device and node policies read it (`hami.fitting`,
`hami.scheduler.policies.usage`). Device ids cannot contain `,` or `:` (`hami.model`), so the format needs no
quoting.

Reading never fails: only the node daemon may write Node annotations (a tenant controls its pod's, not its
node's), but an entry that is not `<id>:<0-100>` is skipped rather than trusted, and a value outside 0-100 is
clamped, so a bad annotation costs the policy its preference, never a placement.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["BUSY_ANNOTATION", "UNKNOWN_BUSY", "decode_busy", "encode_busy"]

BUSY_ANNOTATION = "hami.io/node-device-busy"
UNKNOWN_BUSY = 50.0
"""The busy share the `usage` policies count for a device without a measurement: after an idle device, before a
saturated one (neither preferred nor ruled out)."""


def encode_busy(busy: Mapping[str, float]) -> str:
    """The annotation's value for `busy` (device id → percent), whole percents, in device id order."""
    return ",".join(f"{uuid}:{round(min(max(value, 0.0), 100.0))}" for uuid, value in sorted(busy.items()))


def decode_busy(value: str | None) -> dict[str, float]:
    """Device id → busy percent (0-100) from the annotation's value; malformed entries are left out."""
    out: dict[str, float] = {}
    for entry in (value or "").split(","):
        uuid, sep, number = entry.strip().rpartition(":")
        if not sep or not uuid:
            continue
        try:
            busy = float(number)
        except ValueError:
            continue
        if busy == busy:  # not NaN
            out[uuid] = min(max(busy, 0.0), 100.0)
    return out
