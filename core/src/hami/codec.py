"""HAMi v2.10's annotation encodings, both directions (protocol.md sections 2 and 3).

Owns the byte-level formats of the node register annotations (JSON and the legacy colon strings), the pod
device strings, the node lock, the handshake, the link-score table and the dynamic-MIG reservation list.
Encoders produce exactly the bytes HAMi writes; decoders accept what HAMi accepts and turn anything else
into one exception type, `AnnotationError`, which names the annotation and the offending part. No other
exception escapes a decoder, whatever the input (the test suite fuzzes this).

This module knows formats, not meaning: which key a vendor uses is `hami.model.AnnotationKeys`' business.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache, partial
from typing import Any, Literal

from pydantic import ValidationError

from hami.errors import HamiError
from hami.model import ContainerDevice, ContainerPlacement, Device

__all__ = [
    "AnnotationError",
    "Handshake",
    "MigReservation",
    "NodeLock",
    "decode_handshake",
    "decode_legacy_register",
    "decode_link_scores",
    "decode_mig_allocations",
    "decode_node_lock",
    "decode_node_register",
    "decode_pod_devices",
    "encode_handshake",
    "encode_legacy_register",
    "encode_link_scores",
    "encode_mig_allocations",
    "encode_node_lock",
    "encode_node_register",
    "encode_pod_devices",
]

HANDSHAKE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


class AnnotationError(HamiError, ValueError):
    """An annotation value that cannot be decoded.

    `annotation` is the annotation key (or a description of the value when the key is not known here),
    `part` the offending piece of the value, and the message says what a well-formed value looks like.
    """

    def __init__(self, annotation: str, part: str, problem: str) -> None:
        self.annotation = annotation
        self.part = part
        self.problem = problem
        shown = part if len(part) <= 120 else part[:117] + "..."
        super().__init__(f"annotation {annotation}: {problem} (at {shown!r})")


# --------------------------------------------------------------------------------------------------------
# JSON as Go's encoding/json writes it
# --------------------------------------------------------------------------------------------------------

_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def _go_json(value: Any) -> str:
    """Compact JSON with Go's HTML-safe escaping, so bytes match what a Go writer produces."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).translate(_GO_ESCAPES)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # Python's json accepts NaN and Infinity; Go's decoder does not


def _finite_float(text: str) -> float:
    number = float(text)
    if number in (float("inf"), float("-inf")):
        raise ValueError(f"number {text} is out of range")  # as Go's decoder says of 1e400
    return number


def _load_json(value: str, annotation: str) -> Any:
    if not isinstance(value, str):
        raise AnnotationError(annotation, repr(value), f"expected a string, got {type(value).__name__}")
    if not value.strip():
        return None
    try:
        return json.loads(value, parse_constant=_no_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as exc:
        raise AnnotationError(annotation, value, f"not valid JSON: {exc}") from None


def _int_field(obj: Mapping[str, Any], key: str, annotation: str, default: int = 0) -> int:
    v = obj.get(key)
    if v is None:  # absent, or JSON null: Go leaves the zero value
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise AnnotationError(annotation, f"{key}={v!r}", f"{key!r} must be an integer")
    return v


def _str_field(obj: Mapping[str, Any], key: str, annotation: str) -> str:
    v = obj.get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise AnnotationError(annotation, f"{key}={v!r}", f"{key!r} must be a string")
    return v


def _fold(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Object keys lower-cased: Go's decoder matches struct field names case-insensitively."""
    return {str(k).lower(): v for k, v in obj.items()}


def _go_map(value: Any) -> Any:
    """Go's encoder writes a map's keys sorted; struct fields keep their order. Sort the maps inside `value`."""
    if isinstance(value, Mapping):
        return {k: _go_map(value[k]) for k in sorted(value)}
    if isinstance(value, list | tuple):
        return [_go_map(v) for v in value]
    return value


def _build(model: type[Any], annotation: str, part: str | Callable[[], str], **fields: Any) -> Any:
    """Construct `model`; a validation failure becomes an AnnotationError showing `part` (made only then)."""
    try:
        return model(**fields)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())
        raise AnnotationError(annotation, part() if callable(part) else part, problems) from None


# --------------------------------------------------------------------------------------------------------
# Node register, JSON form (`hami.io/node-nvidia-register`, `hami.io/node-register-<CW>`)
# --------------------------------------------------------------------------------------------------------


def encode_node_register(devices: Iterable[Device]) -> str:
    """The JSON array HAMi's device plugins write. Zero values are omitted except `numa` and `index`."""
    out = []
    for d in devices:
        obj: dict[str, Any] = {"id": d.id}
        if d.count:
            obj["count"] = d.count
        if d.devmem:
            obj["devmem"] = d.devmem
        if d.devcore:
            obj["devcore"] = d.devcore
        if d.type:
            obj["type"] = d.type
        obj["numa"] = d.numa
        if d.health:
            obj["health"] = True
        obj["index"] = d.index
        if d.mode:
            obj["mode"] = d.mode
        if d.mig_profiles:
            obj["migProfiles"] = list(d.mig_profiles)
        if d.vendor:
            obj["devicevendor"] = d.vendor
        if d.custom:
            obj["custominfo"] = _go_map(d.custom)
        out.append(obj)
    return _go_json(out)


_REGISTER_KEYS = {
    "id", "index", "count", "devmem", "devcore", "type", "numa", "health", "mode",
    "migprofiles", "migtemplate", "devicevendor", "custominfo", "devicepairscore",
}  # fmt: skip


def decode_node_register(value: str, annotation: str = "node register") -> list[Device]:
    """Devices from a JSON register annotation. Keys match case-insensitively, as Go's decoder does.

    As in Go, a key that is absent takes its zero value: a device without `"health": true` is unhealthy.
    """
    data = _load_json(value, annotation)
    if data is None:
        return []
    if not isinstance(data, list):
        raise AnnotationError(annotation, value, "expected a JSON array of device objects")
    devices = []
    for i, raw in enumerate(data):
        if not isinstance(raw, dict):
            raise AnnotationError(annotation, repr(raw), f"device #{i} is not a JSON object")
        obj = {k: v for k, v in _fold(raw).items() if k in _REGISTER_KEYS}
        health = obj.get("health")
        if health is None:
            health = False
        if not isinstance(health, bool):
            raise AnnotationError(annotation, f"health={health!r}", "'health' must be true or false")
        profiles = obj.get("migprofiles", obj.get("migtemplate")) or []
        if not isinstance(profiles, list):
            raise AnnotationError(annotation, f"migProfiles={profiles!r}", "'migProfiles' must be a JSON array")
        custom = obj.get("custominfo") or {}
        if not isinstance(custom, dict):
            raise AnnotationError(annotation, f"custominfo={custom!r}", "'custominfo' must be a JSON object")
        devices.append(
            _build(
                Device,
                annotation,
                partial(_go_json, raw),
                id=_str_field(obj, "id", annotation),
                index=_int_field(obj, "index", annotation),
                count=_int_field(obj, "count", annotation),
                devmem=_int_field(obj, "devmem", annotation),
                devcore=_int_field(obj, "devcore", annotation),
                type=_str_field(obj, "type", annotation),
                numa=_int_field(obj, "numa", annotation),
                health=health,
                mode=_str_field(obj, "mode", annotation),
                mig_profiles=tuple(profiles),
                vendor=_str_field(obj, "devicevendor", annotation),
                custom=custom,
            )
        )
    return devices


# --------------------------------------------------------------------------------------------------------
# Node register, legacy string form (Hygon, Iluvatar)
# --------------------------------------------------------------------------------------------------------

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def encode_legacy_register(devices: Iterable[Device], fields: Literal[7, 9] = 9) -> str:
    """`<id>,<count>,<devmem>,<devcore>,<type>,<numa>,<health>[,<index>,<mode>]:` per device."""
    parts = []
    for d in devices:
        items = [
            d.id,
            str(d.count),
            str(d.devmem),
            str(d.devcore),
            d.type,
            str(d.numa),
            "true" if d.health else "false",
        ]
        if fields == 9:
            items += [str(d.index), d.mode]
        parts.append(",".join(items) + ":")
    return "".join(parts)


def _parse_int(text: str, annotation: str, what: str, entry: str) -> int:
    stripped = text.strip()
    body = stripped[1:] if stripped[:1] in "+-" else stripped
    if not body.isascii() or not body.isdigit():
        raise AnnotationError(annotation, entry, f"{what} {text!r} is not an integer")
    try:
        return int(stripped)
    except ValueError:  # more digits than int() converts
        raise AnnotationError(annotation, entry, f"{what} {text!r} is out of range") from None


def decode_legacy_register(value: str, annotation: str = "node register") -> list[Device]:
    """Devices from a legacy register string (7 or 9 comma fields per entry, entries ended by `:`)."""
    if not isinstance(value, str):
        raise AnnotationError(annotation, repr(value), f"expected a string, got {type(value).__name__}")
    devices = []
    for entry in value.split(":"):
        if not entry:
            continue
        items = entry.split(",")
        if len(items) not in (7, 9):
            raise AnnotationError(
                annotation,
                entry,
                f"a device entry has {len(items)} fields; expected 7 (id,count,devmem,devcore,type,numa,health) "
                "or 9 (…,index,mode)",
            )
        health_text = items[6].strip()
        if health_text not in _TRUE and health_text not in _FALSE:
            raise AnnotationError(annotation, entry, f"health {items[6]!r} is not true or false")
        fields: dict[str, Any] = {
            "id": items[0],
            "count": _parse_int(items[1], annotation, "count", entry),
            "devmem": _parse_int(items[2], annotation, "devmem", entry),
            "devcore": _parse_int(items[3], annotation, "devcore", entry),
            "type": items[4],
            "numa": _parse_int(items[5], annotation, "numa", entry),
            "health": health_text in _TRUE,
        }
        if len(items) == 9:
            fields["index"] = _parse_int(items[7], annotation, "index", entry)
            fields["mode"] = items[8]
        devices.append(_build(Device, annotation, entry, **fields))
    return devices


# --------------------------------------------------------------------------------------------------------
# Pod device strings (`hami.io/vgpu-devices-allocated` and friends)
# --------------------------------------------------------------------------------------------------------


def encode_pod_devices(containers: Sequence[ContainerPlacement]) -> str:
    """One `;`-terminated entry per container, each device `<UUID>,<Type>,<Usedmem>,<Usedcores>:`.

    Positional: pass every container of the pod, init containers first, with an empty placement for a
    container without devices, and its empty entry is kept.
    """
    return "".join(
        "".join(f"{d.uuid},{d.type},{d.usedmem},{d.usedcores}:" for d in devices) + ";" for devices in containers
    )


def decode_pod_devices(value: str, annotation: str = "pod devices") -> tuple[ContainerPlacement, ...]:
    """Placements per container from a pod device string; empty entries stay, positions never shift."""
    if not isinstance(value, str):
        raise AnnotationError(annotation, repr(value), f"expected a string, got {type(value).__name__}")
    return _decode_pod_devices(value, annotation)


@lru_cache(maxsize=256)
def _decode_pod_devices(value: str, annotation: str) -> tuple[ContainerPlacement, ...]:
    """`decode_pod_devices` of a string. The answer is immutable (tuples of frozen models), so the last ones are
    kept: the scheduler reads each pod's string twice in a row (its usage, then its quota), at start-up 40,000."""
    if not value:
        return ()
    entries = value.split(";")
    if entries[-1] == "":
        entries.pop()
    containers: list[ContainerPlacement] = []
    for entry in entries:
        devices = []
        for item in entry.split(":"):
            if not item:
                continue
            fields = item.split(",")
            if len(fields) != 4:
                raise AnnotationError(
                    annotation,
                    item,
                    f"a device has {len(fields)} fields; expected 4: <UUID>,<Type>,<Usedmem>,<Usedcores>",
                )
            devices.append(
                _build(
                    ContainerDevice,
                    annotation,
                    item,
                    uuid=fields[0],
                    type=fields[1],
                    usedmem=_parse_int(fields[2], annotation, "usedmem", item),
                    usedcores=_parse_int(fields[3], annotation, "usedcores", item),
                )
            )
        containers.append(tuple(devices))
    return tuple(containers)


# --------------------------------------------------------------------------------------------------------
# Node lock (`hami.io/mutex.lock`) and handshake (`hami.io/node-handshake…`)
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeLock:
    """Who holds a node's lock and since when. `uid` is this project's extension (HAMi writes three fields)."""

    time: datetime
    namespace: str = ""
    name: str = ""
    uid: str = ""


def _rfc3339(t: datetime) -> str:
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    text = t.replace(microsecond=0).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def encode_node_lock(lock: NodeLock) -> str:
    """`<RFC3339 time>,<namespace>,<name>` (and `,<uid>` when the owner's UID is known)."""
    fields = [_rfc3339(lock.time), lock.namespace, lock.name]
    if lock.uid:
        fields.append(lock.uid)
    return ",".join(fields)


def decode_node_lock(value: str, annotation: str = "hami.io/mutex.lock") -> NodeLock:
    """A node lock; a bare time (HAMi's oldest form) is accepted and has no owner."""
    if not isinstance(value, str):
        raise AnnotationError(annotation, repr(value), f"expected a string, got {type(value).__name__}")
    fields = value.split(",")
    if len(fields) not in (1, 3, 4):
        raise AnnotationError(
            annotation, value, f"{len(fields)} comma fields; expected <RFC3339 time>,<namespace>,<name>[,<uid>]"
        )
    try:
        when = datetime.fromisoformat(fields[0])
    except ValueError:
        raise AnnotationError(annotation, fields[0], "the lock time is not an RFC 3339 timestamp") from None
    if when.tzinfo is None or "T" not in fields[0].upper():
        raise AnnotationError(
            annotation, fields[0], "the lock time must be RFC 3339 with a zone, e.g. 2025-01-02T03:04:05Z"
        )
    when = when.replace(microsecond=0)  # the format carries seconds (Go's time.RFC3339 writes no fraction)
    if len(fields) == 1:
        return NodeLock(when)
    return NodeLock(when, *fields[1:])


@dataclass(frozen=True, slots=True)
class Handshake:
    """A handshake annotation: `Requesting_…` from the scheduler, `Reported_…`/`Deleted_…` from the node side."""

    state: Literal["Requesting", "Reported", "Deleted"]
    time: datetime


def encode_handshake(handshake: Handshake) -> str:
    t = handshake.time  # not strftime: glibc's %Y does not pad years below 1000 to four digits as Go does
    return f"{handshake.state}_{t.year:04d}-{t.month:02d}-{t.day:02d} {t.hour:02d}:{t.minute:02d}:{t.second:02d}"


def decode_handshake(value: str, annotation: str = "hami.io/node-handshake") -> Handshake:
    if not isinstance(value, str):
        raise AnnotationError(annotation, repr(value), f"expected a string, got {type(value).__name__}")
    state, sep, when = value.partition("_")
    if not sep or state not in ("Requesting", "Reported", "Deleted"):
        raise AnnotationError(annotation, value, "expected Requesting_<time>, Reported_<time> or Deleted_<time>")
    try:
        parsed = datetime.strptime(when, HANDSHAKE_TIME_FORMAT)
    except ValueError:
        raise AnnotationError(annotation, when, "the handshake time must look like 2025-01-02 03:04:05") from None
    return Handshake(state, parsed)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------------
# Link scores (`hami.io/node-nvidia-score`) and dynamic-MIG reservations (`hami.io/vgpu-mig-allocations`)
# --------------------------------------------------------------------------------------------------------


def encode_link_scores(scores: Mapping[str, Mapping[str, int]]) -> str:
    """`[{"uuid":"GPU-a","score":{"GPU-b":<int>}}]`, devices in the order given, peers sorted (a Go map)."""
    # Go omits an empty "score" map (omitempty)
    return _go_json([{"uuid": u, "score": _go_map(peers)} if peers else {"uuid": u} for u, peers in scores.items()])


def decode_link_scores(value: str, annotation: str = "link scores") -> dict[str, dict[str, int]]:
    data = _load_json(value, annotation)
    if data is None:
        return {}
    if not isinstance(data, list):
        raise AnnotationError(annotation, value, 'expected a JSON array of {"uuid":…,"score":{…}} objects')
    out: dict[str, dict[str, int]] = {}
    for raw in data:
        entry = _fold(raw) if isinstance(raw, dict) else {}
        if not isinstance(entry.get("uuid"), str):
            raise AnnotationError(annotation, repr(raw), 'each entry needs a string "uuid"')
        peers = entry.get("score") or {}
        if not isinstance(peers, dict):
            raise AnnotationError(annotation, repr(raw), '"score" must map device UUIDs to integers')
        out[entry["uuid"]] = {str(k): _int_field(peers, k, annotation) for k in peers}
    return out


@dataclass(frozen=True, slots=True)
class MigReservation:
    """One MIG instance reserved by the scheduler for a container; the node side fills in the instance IDs."""

    container_index: int
    device_index: int
    gpu_uuid: str
    profile: str
    start: int
    size: int
    mig_uuid: str = ""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


def encode_mig_allocations(reservations: Iterable[MigReservation]) -> str:
    out = []
    for r in reservations:
        obj: dict[str, Any] = {
            "containerIndex": r.container_index,
            "deviceIndex": r.device_index,
            "gpuUUID": r.gpu_uuid,
            "profile": r.profile,
            "placement": {"start": r.start, "size": r.size},
        }
        if r.mig_uuid:
            obj["migUUID"] = r.mig_uuid
        if r.gpu_instance_id is not None:
            obj["gpuInstanceID"] = r.gpu_instance_id
        if r.compute_instance_id is not None:
            obj["computeInstanceID"] = r.compute_instance_id
        out.append(obj)
    return _go_json(out)


def decode_mig_allocations(value: str, annotation: str = "hami.io/vgpu-mig-allocations") -> list[MigReservation]:
    data = _load_json(value, annotation)
    if data is None:
        return []
    if not isinstance(data, list):
        raise AnnotationError(annotation, value, "expected a JSON array of reservations")
    out = []
    for raw in data:
        if not isinstance(raw, dict):
            raise AnnotationError(annotation, repr(raw), "each reservation must be a JSON object")
        obj = _fold(raw)
        placement = obj.get("placement")
        if not isinstance(placement, dict):
            raise AnnotationError(annotation, repr(raw), 'a reservation needs "placement": {"start":…,"size":…}')
        placement = _fold(placement)
        numbers = {
            "container_index": _int_field(obj, "containerindex", annotation, -1),
            "device_index": _int_field(obj, "deviceindex", annotation, -1),
            "start": _int_field(placement, "start", annotation, -1),
            "size": _int_field(placement, "size", annotation, 0),
        }
        for name, number in numbers.items():
            if number < 0 or (name == "size" and number == 0):
                raise AnnotationError(annotation, repr(raw), f"{name} is missing or out of range")
        gpu_uuid = _str_field(obj, "gpuuuid", annotation)
        profile = _str_field(obj, "profile", annotation)
        if not gpu_uuid or not profile:  # HAMi refuses an incomplete reservation too
            raise AnnotationError(annotation, repr(raw), 'a reservation needs a non-empty "gpuUUID" and "profile"')
        gi = obj.get("gpuinstanceid")
        ci = obj.get("computeinstanceid")
        out.append(
            MigReservation(
                mig_uuid=_str_field(obj, "miguuid", annotation),
                gpu_instance_id=None if gi is None else _int_field(obj, "gpuinstanceid", annotation),
                compute_instance_id=None if ci is None else _int_field(obj, "computeinstanceid", annotation),
                gpu_uuid=gpu_uuid,
                profile=profile,
                **numbers,
            )
        )
    return out
