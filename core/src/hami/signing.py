"""Signed placements: the scheduler's decision on a pod, authenticated so that the pod's owner cannot forge it.

HAMi records the scheduler's decision in plain pod annotations (`…-devices-allocated`, `…-devices-to-allocate`,
and the vendors' own, such as NVIDIA's MIG reservations), which anyone allowed to patch pods in the namespace
can rewrite. This module owns one addition to that wire format, `hami.io/placement-signature`: the decided
values of the annotations it covers, the pod's UID and node, and an HMAC-SHA256 over them with a key only the
scheduler and the node daemon can read. HAMi's own annotations are written and read exactly as before; a
component that does not know this annotation ignores it.

The annotation's value is `v1.<payload>.<mac>`: `payload` is the base64url (unpadded) of the canonical JSON
`{"node": …, "uid": …, "annotations": {key: value, …}}` (sorted keys, no spaces) and `mac` the hex HMAC-SHA256
of `payload` under the current key. It carries the signed values themselves, so a reader recovers the decision
from the signature alone whatever later happened to the annotations it covers.

Keys (`PlacementKeys`) come from a directory, the mounted Secret: `current` signs and verifies, `previous`
(optional) only verifies, so a key is rotated by moving `current` to `previous`, writing a new `current`, and
dropping `previous` once every live pod was placed under the new key. `PlacementKeys.from_environment()`
reads the directory named by `HAMI_PLACEMENT_KEYS`; with none configured, nothing is signed or verified
(HAMi's behaviour, e.g. a node daemon under HAMi's own scheduler), and each service says so in its log.

Both the scheduler (signs, and counts usage from what verifies) and the node daemon (serves only what verifies,
signs what it writes back) use this module; it imports nothing of either.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hami.errors import ConfigError, HamiError

__all__ = [
    "KEYS_ENVIRONMENT",
    "SIGNATURE_ANNOTATION",
    "PlacementKeys",
    "SignatureError",
    "SignedPlacement",
    "changed",
]

SIGNATURE_ANNOTATION = "hami.io/placement-signature"
KEYS_ENVIRONMENT = "HAMI_PLACEMENT_KEYS"
"""The environment variable naming the key directory (files `current` and, optionally, `previous`)."""

_VERSION = "v1"
_MIN_KEY_BYTES = 16


class SignatureError(HamiError):
    """A placement signature is absent, malformed, made with an unknown key, or for another pod or node."""


@dataclass(frozen=True, slots=True)
class SignedPlacement:
    """What the scheduler (or the node daemon, for its own writes) decided for one pod, as signed."""

    uid: str
    node: str
    annotations: Mapping[str, str]


def _canonical(placement: SignedPlacement) -> bytes:
    body = {"annotations": dict(placement.annotations), "node": placement.node, "uid": placement.uid}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


class PlacementKeys:
    """The signing key and the keys still accepted; signs and verifies `hami.io/placement-signature`."""

    def __init__(self, current: bytes, previous: bytes | None = None, *, source: str = "") -> None:
        for name, key in (("current", current), ("previous", previous)):
            if key is not None and len(key) < _MIN_KEY_BYTES:
                raise ConfigError(
                    f"placement key {name}{' in ' + source if source else ''} has {len(key)} bytes; use at least "
                    f"{_MIN_KEY_BYTES} random bytes (the chart makes 32)"
                )
        self._current = current
        self._accepted = (current,) if previous is None else (current, previous)
        self.source = source

    @classmethod
    def from_directory(cls, directory: str | os.PathLike[str]) -> PlacementKeys:
        """The keys in `directory` (`current`, optional `previous`; surrounding whitespace is ignored).

        :raises ConfigError: `current` is missing or unreadable, or a key is too short."""
        path = Path(directory)
        try:
            current = (path / "current").read_bytes().strip()
        except OSError as exc:
            raise ConfigError(
                f"cannot read the placement signing key {path / 'current'}: {exc.strerror or exc}. Mount the "
                f"placement-key Secret there (the chart's placementSigning), or unset {KEYS_ENVIRONMENT} to run "
                "without signed placements"
            ) from None
        previous_path = path / "previous"
        previous = None
        if previous_path.is_file():
            previous = previous_path.read_bytes().strip() or None
        return cls(current, previous, source=str(path))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> PlacementKeys | None:
        """The keys of the directory named by `HAMI_PLACEMENT_KEYS`, or None when it is unset or empty."""
        value = (environ if environ is not None else os.environ).get(KEYS_ENVIRONMENT, "").strip()
        return cls.from_directory(value) if value else None

    # ---------------------------------------------------------------------------------- signing

    def sign(self, placement: SignedPlacement) -> str:
        """The `hami.io/placement-signature` value for `placement`, under the current key."""
        payload = base64.urlsafe_b64encode(_canonical(placement)).rstrip(b"=").decode()
        mac = hmac.new(self._current, payload.encode(), hashlib.sha256).hexdigest()
        return f"{_VERSION}.{payload}.{mac}"

    def read(self, value: str | None) -> SignedPlacement:
        """The placement a signature value carries, once its MAC verifies under an accepted key.

        Says nothing about which pod it is on: `verify` also checks the UID and node.
        :raises SignatureError: absent, malformed or not made with an accepted key."""
        if not value:
            raise SignatureError(f"no {SIGNATURE_ANNOTATION} annotation")
        parts = value.split(".")
        if len(parts) != 3 or parts[0] != _VERSION:
            raise SignatureError(f"{SIGNATURE_ANNOTATION} is not of the form {_VERSION}.<payload>.<mac>")
        payload, mac = parts[1], parts[2]
        if not any(
            hmac.compare_digest(hmac.new(key, payload.encode(), hashlib.sha256).hexdigest(), mac)
            for key in self._accepted
        ):
            raise SignatureError(f"{SIGNATURE_ANNOTATION} does not verify under the placement keys")
        try:
            body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            annotations = body["annotations"]
            placement = SignedPlacement(str(body["uid"]), str(body["node"]), dict(annotations))
        except (binascii.Error, ValueError, KeyError, TypeError) as exc:  # only a holder of the key could get here
            raise SignatureError(f"{SIGNATURE_ANNOTATION} verifies but its payload is unreadable: {exc}") from None
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in placement.annotations.items()):
            raise SignatureError(f"{SIGNATURE_ANNOTATION} verifies but its annotations are not strings")
        return placement

    def verify(self, annotations: Mapping[str, str], uid: str, node: str) -> SignedPlacement:
        """The signed placement of a pod with `annotations`, UID `uid`, on `node`.

        :raises SignatureError: no signature, one that does not verify, or one made for another pod or node."""
        placement = self.read(annotations.get(SIGNATURE_ANNOTATION))
        if placement.uid != uid:
            raise SignatureError(
                f"{SIGNATURE_ANNOTATION} was made for the pod with UID {placement.uid}, not this one ({uid})"
            )
        if placement.node != node:
            raise SignatureError(
                f"{SIGNATURE_ANNOTATION} places the pod on node {placement.node}, not on {node or 'no node'}"
            )
        return placement


def changed(annotations: Mapping[str, str], placement: SignedPlacement) -> list[str]:
    """The signed annotation keys whose value on the pod differs from the signed one (sorted)."""
    return sorted(k for k, v in placement.annotations.items() if annotations.get(k) != v)
