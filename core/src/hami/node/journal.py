"""The Allocate journal: what the node daemon answered, kept on the host until the kubelet surely has it.

Allocate is not acknowledged: the daemon empties the served entries of the pod's to-allocate annotation,
marks the pod allocated and releases the node lock, and only then does the kubelet read the answer. A daemon
that dies in between used to leave a pod whose retried Allocate found nothing to serve. So before its first
write to the API, each Allocate records its answer here, one file per pod UID and device kind (the latest
call: the kubelet starts a pod's containers one call at a time), written atomically (temporary file, fsync,
rename), and a retry (`hami.node.allocate`) answers from it: the same edits, byte for byte, without asking the
vendor again.

File names are a SHA-256 of the UID and the kind, never the pod's own strings, so a hostile name cannot steer
a write outside the directory. Entries older than `retention` seconds are removed as new ones are written; a
retry older than that is refused as today (its pod has long been reported failed by the kubelet).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from hami.model import ContainerEdits, ContainerPlacement

__all__ = ["AllocationJournal", "JournalEntry"]

log = logging.getLogger(__name__)

_PLACEMENTS = TypeAdapter(list[ContainerPlacement])
_EDITS = TypeAdapter(list[ContainerEdits])


@dataclass(frozen=True)
class JournalEntry:
    """One Allocate call's answer for one pod and kind."""

    uid: str
    namespace: str
    name: str
    kind: str
    containers: tuple[int, ...]
    """The containers served, by position (init containers first), in the kubelet's request order."""
    placements: tuple[ContainerPlacement, ...]
    edits: tuple[ContainerEdits, ...]
    time: float
    requests: tuple[tuple[str, ...], ...] = ()
    """The device IDs the kubelet gave, per container request."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """The pod annotations the call wrote beside its to-allocate entries (the vendor's, re-signed)."""

    def answers(self, requests: Sequence[Sequence[str]]) -> bool:
        """Whether this entry answers a request of the same shape (containers and device counts)."""
        return len(requests) == len(self.placements) and all(
            len(r) == len(p) for r, p in zip(requests, self.placements, strict=True)
        )


class AllocationJournal:
    """The journal directory of one node daemon (under its host hook directory, so it survives restarts)."""

    def __init__(self, directory: Path, *, retention: float = 3600.0) -> None:
        self.directory = directory
        self.retention = retention

    def _path(self, uid: str, kind: str) -> Path:
        digest = hashlib.sha256(f"{uid}\0{kind}".encode()).hexdigest()
        return self.directory / f"{digest}.json"

    def record(self, entry: JournalEntry) -> None:
        """Write `entry` durably (replacing the pod's previous one for the kind); :raises OSError: it failed."""
        self.directory.mkdir(parents=True, exist_ok=True)
        body = {
            "uid": entry.uid,
            "namespace": entry.namespace,
            "name": entry.name,
            "kind": entry.kind,
            "containers": list(entry.containers),
            "placements": _PLACEMENTS.dump_python(list(entry.placements), mode="json"),
            "edits": _EDITS.dump_python(list(entry.edits), mode="json"),
            "time": entry.time,
            "requests": [list(r) for r in entry.requests],
            "annotations": dict(entry.annotations),
        }
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".entry-")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(body, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self._path(entry.uid, entry.kind))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        with contextlib.suppress(OSError):
            directory = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        self.prune()

    def get(self, uid: str, kind: str) -> JournalEntry | None:
        """The latest answer for the pod and kind, or None (absent, unreadable or past retention)."""
        return self._read(self._path(uid, kind))

    def entries(self, kind: str) -> Iterator[JournalEntry]:
        """Every entry of `kind` still within retention."""
        with contextlib.suppress(FileNotFoundError):
            for path in sorted(self.directory.glob("*.json")):
                entry = self._read(path)
                if entry is not None and entry.kind == kind:
                    yield entry

    def prune(self) -> None:
        """Remove the entries past retention."""
        cutoff = time.time() - self.retention
        with contextlib.suppress(FileNotFoundError):
            for path in self.directory.glob("*.json"):
                with contextlib.suppress(OSError):
                    if path.stat().st_mtime < cutoff:
                        path.unlink()

    def _read(self, path: Path) -> JournalEntry | None:
        try:
            body = json.loads(path.read_text())
            entry = JournalEntry(
                uid=str(body["uid"]),
                namespace=str(body["namespace"]),
                name=str(body["name"]),
                kind=str(body["kind"]),
                containers=tuple(int(i) for i in body["containers"]),
                placements=tuple(_PLACEMENTS.validate_python(body["placements"])),
                edits=tuple(_EDITS.validate_python(body["edits"])),
                time=float(body["time"]),
                requests=tuple(tuple(str(i) for i in r) for r in body["requests"]),
                annotations={str(k): str(v) for k, v in body["annotations"].items()},
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, ValidationError) as exc:
            log.warning("ignoring the unreadable Allocate journal entry %s: %s", path, exc)
            return None
        if entry.time < time.time() - self.retention:
            return None
        return entry
