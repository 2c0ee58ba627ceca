"""Workload traces in the openb format (Alibaba cluster-trace-gpu-v2023), and sampling them as the FGD paper does.

Owns reading the node list (`sn,cpu_milli,memory_mib,gpu,model`) and the pod lists (the full eleven-column
form and the five-column `multigpu` form), with errors that name the file, the line and the column; and the
paper's sampling, in two readings (`SAMPLING`):

- `top-up` (default), what the FGD authors' simulator does and so what their published numbers measure: every
  pod of the trace once, in an order shuffled by the seed, then pods drawn at random with replacement appended
  until the total GPU request reaches `tune` × the cluster's GPUs (nothing is appended when the trace alone
  reaches it, as the multigpu lists do);
- `resample`, the paper's prose: pods drawn with replacement until the total reaches `tune` × capacity, shuffled.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hami.errors import ConfigError

__all__ = ["SAMPLING", "TraceNode", "TracePod", "read_nodes", "read_pods", "sample_pods"]

SAMPLING = ("top-up", "resample")
"""How `sample_pods` builds the arrival sequence; the first is the default."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    """Thousandths of one GPU for a sharing pod (num_gpu == 1); 1000 for whole GPUs."""
    gpu_spec: tuple[str, ...] = ()
    """GPU models the pod may run on (empty: any)."""
    qos: str = ""
    """The trace's QoS class (`LS`, `BE`, `Burstable`, `Guaranteed`), when it has the column."""

    @property
    def gpu_request(self) -> float:
        """GPUs this pod asks for, fractional for sharing pods."""
        if self.num_gpu == 0:
            return 0.0
        return self.num_gpu * self.gpu_milli / 1000 if self.num_gpu == 1 else float(self.num_gpu)


def _rows(path: Path, required: Sequence[str]) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in required if c not in (reader.fieldnames or ())]
            if missing:
                raise ConfigError(
                    f"{path}: missing column(s) {', '.join(missing)}; the header must start {','.join(required)}"
                )
            return list(reader)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except csv.Error as exc:
        raise ConfigError(f"{path}: not a CSV file: {exc}") from None


def _int(path: Path, line: int, row: dict[str, str], column: str) -> int:
    value = (row.get(column) or "").strip()
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{path}:{line}: column {column} is {value!r}, not a whole number") from None
    if number < 0:
        raise ConfigError(f"{path}:{line}: column {column} is negative ({number})")
    return number


def read_nodes(path: str | Path) -> list[TraceNode]:
    path = Path(path)
    nodes = []
    for line, row in enumerate(_rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")), start=2):
        nodes.append(
            TraceNode(
                name=row["sn"].strip(),
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpus=_int(path, line, row, "gpu"),
                model=(row.get("model") or "").strip(),
            )
        )
    if not nodes:
        raise ConfigError(f"{path}: no nodes")
    return nodes


def read_pods(path: str | Path) -> list[TracePod]:
    path = Path(path)
    pods = []
    for line, row in enumerate(_rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")), start=2):
        num_gpu = _int(path, line, row, "num_gpu")
        gpu_milli = _int(path, line, row, "gpu_milli")
        if gpu_milli > 1000:
            raise ConfigError(f"{path}:{line}: gpu_milli {gpu_milli} is more than one GPU (1000)")
        if num_gpu > 0 and gpu_milli == 0:
            raise ConfigError(f"{path}:{line}: num_gpu {num_gpu} with gpu_milli 0")
        spec = tuple(s.strip() for s in (row.get("gpu_spec") or "").split("|") if s.strip())
        pods.append(
            TracePod(
                name=row["name"].strip(),
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli if num_gpu == 1 else (1000 if num_gpu else 0),
                gpu_spec=spec,
                qos=(row.get("qos") or "").strip(),
            )
        )
    if not pods:
        raise ConfigError(f"{path}: no pods")
    return pods


def sample_pods(
    pods: Sequence[TracePod], capacity_gpus: float, tune: float, seed: int, method: str = SAMPLING[0]
) -> list[TracePod]:
    """The pods in arrival order, until their GPU request reaches `tune` × `capacity_gpus` (see `SAMPLING`)."""
    if method not in SAMPLING:
        raise ConfigError(f"unknown sampling {method!r}; known: {', '.join(SAMPLING)}")
    if not any(p.gpu_request for p in pods):
        raise ConfigError("the pod list asks for no GPU at all; nothing to simulate")
    rng = random.Random(seed)
    target = tune * capacity_gpus
    arrivals: list[TracePod] = []
    if method == "top-up":
        arrivals = list(pods)
        rng.shuffle(arrivals)
    total = sum(p.gpu_request for p in arrivals)
    drawn: list[TracePod] = []
    while total < target:
        pod = pods[rng.randrange(len(pods))]
        drawn.append(pod)
        total += pod.gpu_request
    if method == "resample":
        rng.shuffle(drawn)
    return arrivals + drawn
