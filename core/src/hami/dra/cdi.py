"""The CDI spec files that carry a prepared claim's container edits to the container runtime.

For each claim and device kind the plugin writes one spec file (`<cdiDir>/<driver>-claim_<claim UID>.json`,
CDI 0.6.0, kind `<driver>/claim`) with one CDI device named `<claim UID>-<kind>`, whose container edits are
the vendor's `ContainerEdits`: env (visible devices, memory and core limits), mounts (the isolation library,
its `/etc/ld.so.preload`, the grant and accounting directories) and device nodes. The runtime applies them
to every container of the pod that references the claim. Written whole or not at all (a temporary file
renamed over it), root-owned, mode 0644.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hami.model import ContainerEdits

__all__ = [
    "CDI_VERSION",
    "cdi_device_name",
    "safe_name",
    "cdi_kind",
    "container_edits",
    "remove_spec",
    "spec_path",
    "write_spec",
]

CDI_VERSION = "0.6.0"

_NAME = re.compile(r"[^a-zA-Z0-9_.:-]+")


def safe_name(text: str) -> str:
    """`text` with every character a CDI device name (or a file name) cannot hold replaced by ``-``."""
    return _NAME.sub("-", text)


def cdi_kind(driver: str) -> str:
    """The CDI kind of the driver's claim devices: `<driver>/claim`."""
    return f"{driver}/claim"


def cdi_device_name(claim_uid: str, kind: str) -> str:
    """The CDI device name of a claim's devices of one kind."""
    return safe_name(f"{claim_uid}-{kind.lower()}")


def spec_path(directory: Path, driver: str, claim_uid: str) -> Path:
    return directory / f"{driver}-claim_{safe_name(claim_uid)}.json"


def container_edits(edits: ContainerEdits) -> dict[str, Any]:
    """A vendor's `ContainerEdits` as CDI `containerEdits`."""
    out: dict[str, Any] = {}
    if edits.env:
        out["env"] = [f"{k}={v}" for k, v in sorted(edits.env.items())]
    if edits.devices:
        out["deviceNodes"] = [
            {"path": d.container_path, "hostPath": d.host_path, "permissions": d.permissions} for d in edits.devices
        ]
    if edits.mounts:
        out["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"],
            }
            for m in edits.mounts
        ]
    return out


def write_spec(path: Path, driver: str, devices: Mapping[str, ContainerEdits]) -> None:
    """Write the spec file of one claim: CDI device name → its edits. :raises OSError: it could not be written."""
    annotations = {k: v for e in devices.values() for k, v in e.annotations.items()}
    spec: dict[str, Any] = {
        "cdiVersion": CDI_VERSION,
        "kind": cdi_kind(driver),
        "devices": [{"name": name, "containerEdits": container_edits(e)} for name, e in devices.items()],
    }
    if annotations:
        spec["annotations"] = annotations
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as out:
        json.dump(spec, out, indent=1, sort_keys=True)
        temporary = Path(out.name)
    temporary.chmod(0o644)
    os.replace(temporary, path)


def remove_spec(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
