"""Replaying a trace through the real scheduler: the simulator's engine.

Owns turning trace nodes into Node objects of an in-memory cluster (one device per GPU: 1000 MiB of memory
stands for the whole card, so a pod's `gpu_milli` is its memory and its cores are `gpu_milli / 10`), and
scheduling the sampled pods one at a time with **the extender's own `filter`**: requests read by a vendor
plugin, candidate nodes ordered and fitted in batches, the decision recorded as annotations and counted.
What kube-scheduler checks itself, CPU and memory, is checked here before the extender is asked, and pods
without GPUs are placed as kube-scheduler's default scoring would (most free CPU). There are no departures,
as in the FGD paper's method.

The trace's GPUs are served by `hami.simulate.vendor`, a small vendor plugin of its own (`TraceGPU`), so the
simulator needs no vendor package installed and measures the core's policies, not a vendor's quirks.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami.cluster import MemoryCluster
from hami.codec import encode_node_register
from hami.fragmentation import FULL, WorkloadProfile
from hami.measured import BUSY_ANNOTATION, encode_busy
from hami.model import Device
from hami.plugins import VendorPlugins
from hami.scheduler.extender import Extender, ExtenderSettings
from hami.scheduler.policies import ObservedWorkload
from hami.scheduler.policy import NODE_POLICY_ANNOTATION
from hami.scheduler.state import ClusterState
from hami.simulate import vendor
from hami.simulate.trace import TraceNode, TracePod
from hami.simulate.usage import LATENCY_SENSITIVE, Contention, UsageTracker

__all__ = ["POLICIES", "SimulationResult", "simulate", "workload_of"]

POLICIES = ("binpack", "spread", "best-fit", "fragmentation-aware", "usage")
"""Node policies the simulator can run; each brings its own device choice (spread under binpack/spread)."""

SLOTS_PER_GPU = 100
_CAUSE = re.compile(r"usable \(\d+ (.+?)(?:, \d+ |\)$)")
_COUNTS = re.compile(r"\d+/\d+")


@dataclass
class SimulationResult:
    policy: str
    seed: int
    pods: int
    placed: int
    capacity_gpus: int
    alloc_ratio: dict[int, float]
    """arrived workload (% of capacity, every 5) → allocated GPU share (% of capacity)."""
    failed: Counter[str] = field(default_factory=Counter)
    fragmentation_pct: float = 0.0
    seconds: float = 0.0
    contention: Contention | None = None
    """With a usage trace (`hami.simulate.usage`): how latency-sensitive pods ended up beside busy ones."""

    @property
    def unallocated_pct(self) -> dict[int, float]:
        return {arrived: round(100 - ratio, 2) for arrived, ratio in self.alloc_ratio.items()}


def workload_of(pods: Sequence[TracePod]) -> WorkloadProfile:
    """The request mix of a trace, as the fragmentation-aware policy sees it."""
    return WorkloadProfile.from_requests(
        (p.num_gpu, p.gpu_milli, p.cpu_milli, p.memory_mib, p.gpu_spec) for p in pods if p.num_gpu
    )


def _node_object(node: TraceNode) -> dict[str, Any]:
    devices = [
        Device(
            id=f"{node.name}-gpu{i}", index=i, count=SLOTS_PER_GPU, devmem=FULL, devcore=100, type=f"GPU-{node.model}"
        )
        for i in range(node.gpus)
    ]
    annotations = {vendor.KIND.annotations.node_register or "": encode_node_register(devices)} if devices else {}
    allocatable = {"cpu": f"{node.cpu_milli}m", "memory": f"{node.memory_mib}Mi"}
    return {"metadata": {"name": node.name, "annotations": annotations}, "status": {"allocatable": allocatable}}


def _pod_object(index: int, pod: TracePod, opt_in: str | None = None) -> dict[str, Any]:
    """The pod as kube-scheduler would hand it to the extender; `opt_in`: a node policy latency-sensitive pods
    ask for in their annotations (the `usage` run)."""
    names = vendor.KIND.resources
    limits = {names.count: str(pod.num_gpu)}
    if pod.num_gpu == 1 and pod.gpu_milli < FULL:
        limits[names.memory or ""] = str(pod.gpu_milli)
        limits[names.cores or ""] = str(pod.gpu_milli // 10)
    annotations = {vendor.KIND.annotations.use_type or "": ",".join(pod.gpu_spec)} if pod.gpu_spec else {}
    if opt_in is not None and pod.qos == LATENCY_SENSITIVE:
        annotations[NODE_POLICY_ANNOTATION] = opt_in
    return {
        "metadata": {"name": f"{pod.name}-{index}", "namespace": "sim", "annotations": annotations},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "limits": limits,
                        "requests": {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"},
                    },
                }
            ]
        },
    }


def simulate(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    policy: str,
    *,
    seed: int = 0,
    workload: WorkloadProfile | None = None,
    learn: bool = False,
    progress: Callable[[int, int], None] | None = None,
    usage: bool = False,
) -> SimulationResult:
    """Schedule `pods` in order onto `nodes` under `policy`; returns the allocation curve and failures.

    The fragmentation-aware policy plans for `workload` (default: the mix of `pods`), or with `learn`, as the
    live extender does, for the mix of the requests it has filtered so far. With `usage` (always under the `usage`
    policy), each placed pod keeps its devices busy as the synthesised usage trace says (`hami.simulate.usage`),
    each node's measured shares are published on it as its node daemon would, and the result says how the
    latency-sensitive pods ended up beside busy ones."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    started = time.perf_counter()
    plugins = VendorPlugins.from_plugins({"tracegpu": vendor})
    cluster = MemoryCluster()
    objects = [cluster.create("nodes", _node_object(n)) for n in nodes]
    state = ClusterState(plugins)
    state.replay(objects, [])
    # the usage run: latency-sensitive pods opt in (their annotation), the rest get the cluster's default, binpack
    opt_in = "usage" if policy == "usage" else None
    extender = Extender(cluster, plugins, state, ExtenderSettings(node_policy="binpack" if opt_in else policy))
    extender.workload = ObservedWorkload() if learn else ObservedWorkload(fixed=workload or workload_of(pods))

    names = [n.name for n in nodes]
    tracker: UsageTracker | None = None
    if usage or policy == "usage":
        by_name = {meta_name(o): o for o in objects}
        gpus = {n.name: [f"{n.name}-gpu{i}" for i in range(n.gpus)] for n in nodes}

        def publish(node: str, shares: dict[str, float]) -> None:
            obj = by_name[node]
            annotations = {**obj["metadata"].get("annotations", {}), BUSY_ANNOTATION: encode_busy(shares)}
            obj = by_name[node] = {**obj, "metadata": {**obj["metadata"], "annotations": annotations}}
            state.set_node(obj)  # what the node's watch event does after its daemon's patch

        tracker = UsageTracker(seed, gpus.__getitem__, publish if policy == "usage" else None)
        if policy == "usage":  # every node daemon publishes from its start: idle devices read 0, not unknown
            for name, devices in gpus.items():
                if devices:
                    publish(name, dict.fromkeys(devices, 0.0))
    free_cpu = {n.name: n.cpu_milli for n in nodes}
    free_mem = {n.name: n.memory_mib for n in nodes}
    capacity = sum(n.gpus for n in nodes)
    arrived = allocated = 0.0
    curve: dict[int, float] = {0: 0.0}
    next_mark = 5
    failed: Counter[str] = Counter()
    placed = 0
    total = len(pods)
    for index, pod in enumerate(pods):
        arrived += pod.gpu_request
        cpu, memory = pod.cpu_milli, pod.memory_mib
        fits = [n for n in names if free_cpu[n] >= cpu and free_mem[n] >= memory]
        chosen: str | None = None
        if not fits:
            failed["cpu or memory"] += 1
        elif pod.num_gpu == 0:
            # kube-scheduler's own choice (most free CPU), unless the policy scores pods without devices too
            growth = extender.prioritizer.deviceless_growth(_pod_object(index, pod), fits)
            if growth:
                chosen = min(fits, key=lambda n: (growth[n], -free_cpu[n], n))
            else:
                chosen = max(fits, key=lambda n: (free_cpu[n], n))
            state.set_cpu_memory(f"sim/{pod.name}-{index}", chosen, pod.cpu_milli, pod.memory_mib)
        else:
            result = extender.filter(cluster.create("pods", _pod_object(index, pod, opt_in)), fits)
            chosen = result.node
            if chosen is None:
                failed[_cause(result.failed) if not result.error else "error: " + result.error] += 1
            elif tracker is not None:
                record = state.pods[f"sim/{pod.name}-{index}"]
                devices = sorted(record.grants.get(vendor.KIND.common_word, {}))
                tracker.place(record.key, pod, index, chosen, devices)
        if chosen is not None:
            placed += 1
            free_cpu[chosen] -= pod.cpu_milli
            free_mem[chosen] -= pod.memory_mib
            allocated += pod.gpu_request
        while capacity and arrived * 100 >= next_mark * capacity:
            curve[next_mark] = round(100 * allocated / capacity, 2)
            next_mark += 5
        if progress is not None and (index % 200 == 0 or index == total - 1):
            progress(index + 1, total)
    if capacity:
        curve.setdefault(next_mark - 5, round(100 * allocated / capacity, 2))
    profile = workload or workload_of(pods)
    fragment = sum(
        profile.fragmentation(
            state.signature(r, vendor.KIND.common_word), model=r.totals[vendor.KIND.common_word].model
        )
        for r in state.nodes.values()
        if vendor.KIND.common_word in r.totals
    )
    return SimulationResult(
        policy=policy,
        seed=seed,
        pods=total,
        placed=placed,
        capacity_gpus=capacity,
        alloc_ratio=curve,
        failed=failed,
        fragmentation_pct=round(100 * fragment / FULL / capacity, 2) if capacity else 0.0,
        seconds=round(time.perf_counter() - started, 2),
        contention=tracker.contention() if tracker is not None else None,
    )


def meta_name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _cause(failed: dict[str, str]) -> str:
    """The most common reason nodes gave, without the per-node counts."""
    causes: Counter[str] = Counter()
    for reason, count in Counter(failed.values()).items():  # a few distinct reasons among a thousand nodes
        detail = _CAUSE.search(reason)
        if detail:
            causes[detail.group(1)] += count
        else:
            causes[_COUNTS.sub("N", reason.split(": ", 1)[-1])] += count
    return causes.most_common(1)[0][0] if causes else "no node"
