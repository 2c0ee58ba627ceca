"""The conformance kit: named checks every vendor plugin runs from its own tests against a fixture it provides.

A vendor describes itself in a `VendorFixture` (its plugin, example requests with the answers it must
give, candidate nodes to fit onto, placements to edit) and calls `pytest_suite`, which produces one test
per check. A check runs when the vendor implements the hooks it exercises and the fixture provides its
material. A check whose hooks the vendor does not implement is reported as skipped, with the hook named; a
check whose hooks the vendor implements but whose material the fixture lacks fails, naming the fixture field
to fill, so a partial fixture never passes as a complete one. `applicable` lists both. Third-party vendors run
exactly the same kit.

Each check names the failure it guards against; HAMi's own conformance idea, with this project's checks.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami.errors import PluginError, RequestError
from hami.model import (
    Container,
    ContainerPlacement,
    ContainerRequest,
    DeviceUsage,
    NodeFit,
    NodeView,
    Pod,
    SchedulingPolicy,
)
from hami.plugins import PluginSource, VendorPlugins, installed_sources

__all__ = [
    "CHECKS",
    "Check",
    "ConformanceFailure",
    "NOT_IMPLEMENTED",
    "EditCase",
    "RequestCase",
    "VendorFixture",
    "applicable",
    "pytest_suite",
    "run_check",
]


class ConformanceFailure(AssertionError):
    """A plugin broke a rule of the contract; the message says which rule and with what input."""


@dataclass(frozen=True)
class RequestCase:
    """One container's resources and what the vendor must read from them.

    `expect` is the request the vendor must return, None when the container asks for nothing of `kind`,
    or a string that must appear in the `RequestError` the vendor raises.
    """

    kind: str
    resources: Mapping[str, str]
    expect: ContainerRequest | str | None
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EditCase:
    """A placement of one container, for the container-edit checks."""

    kind: str
    placement: ContainerPlacement
    container_index: int = 0
    pod: Pod = field(default_factory=lambda: Pod(name="edit-check", namespace="default", uid="uid-edit-check"))


@dataclass
class VendorFixture:
    """What a vendor gives the kit: its plugin and the material the checks run on."""

    name: str
    plugin: object
    config: Mapping[str, Any] = field(default_factory=dict)
    requests: Sequence[RequestCase] = ()
    nodes: Mapping[str, Callable[[], list[NodeView]]] = field(default_factory=dict)
    """device kind → a function building fresh candidate nodes (with some usage already on them)."""
    fit_requests: Mapping[str, Sequence[ContainerRequest]] = field(default_factory=dict)
    """device kind → single-container requests to fit onto those nodes."""
    edits: Sequence[EditCase] = ()

    def plugins(self) -> VendorPlugins:
        try:
            return VendorPlugins.from_plugins({self.name: self.plugin}, config={self.name: self.config}, strict=True)
        except PluginError as exc:
            raise ConformanceFailure(str(exc)) from None


@dataclass(frozen=True)
class Check:
    name: str
    rule: str
    hooks: tuple[str, ...]
    material: Callable[[VendorFixture], bool]
    run: Callable[[VendorFixture, VendorPlugins], None]
    needs: str = ""
    """the fixture fields the check runs on, as its failure names them when they are missing."""


CHECKS: list[Check] = []


def _check(
    rule: str,
    *,
    hooks: tuple[str, ...] = (),
    material: Callable[[VendorFixture], bool] = lambda f: True,
    needs: str = "",
) -> Callable[[Callable[[VendorFixture, VendorPlugins], None]], Callable[[VendorFixture, VendorPlugins], None]]:
    def register(fn: Callable[[VendorFixture, VendorPlugins], None]) -> Callable[[VendorFixture, VendorPlugins], None]:
        CHECKS.append(Check(fn.__name__.removeprefix("check_"), rule, hooks, material, fn, needs))
        return fn

    return register


def _fail(message: str) -> ConformanceFailure:
    return ConformanceFailure(message)


# --------------------------------------------------------------------------------------------------------
# Metadata
# --------------------------------------------------------------------------------------------------------

_RESOURCE = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


@_check("the plugin loads strictly: every hook it marks is in the contract with matching arguments")
def check_hooks_match_contract(fixture: VendorFixture, plugins: VendorPlugins) -> None:
    if len(plugins.vendors) != 1 or "hami_vendor_info" not in plugins.vendors[0].hooks:
        raise _fail("the plugin did not load as exactly one vendor implementing hami_vendor_info")


@_check("metadata is complete: every kind has valid resource names and the pod annotation keys it needs")
def check_metadata_complete(fixture: VendorFixture, plugins: VendorPlugins) -> None:
    info = plugins.vendors[0].info
    for kind in info.kinds:
        for resource in kind.resources.all():
            if not _RESOURCE.match(resource) or resource.split("/")[0].endswith("kubernetes.io"):
                raise _fail(f"{kind.common_word}: {resource!r} is not a valid extended resource name (<domain>/<name>)")
        keys = kind.annotations
        for key in (keys.to_allocate, keys.allocated, keys.node_register, keys.node_handshake, *keys.selectors()):
            if key is not None and not _RESOURCE.match(key):
                raise _fail(f"{kind.common_word}: annotation key {key!r} is not a qualified <prefix>/<name>")
        if keys.to_allocate is not None and keys.to_allocate == keys.allocated:
            raise _fail(f"{kind.common_word}: the to-allocate and allocated annotations must differ")
        if kind.register_format != "capacity" and not keys.node_register:
            raise _fail(f"{kind.common_word}: register format {kind.register_format} needs a node register key")


@_check("names are unique: no resource name, kind or vendor name clashes with another installed vendor")
def check_metadata_unique(fixture: VendorFixture, plugins: VendorPlugins) -> None:
    mine = plugins.vendors[0]
    others = [s for s in installed_sources() if s.name != fixture.name and s.distribution != mine.distribution]
    combined = VendorPlugins.load(sources=others, disabled=())
    source = PluginSource(fixture.name, mine.distribution, mine.version, lambda: fixture.plugin)
    if combined.add(fixture.plugin, source, config={fixture.name: fixture.config}) is None:
        raise _fail(f"clashes with an installed vendor: {combined.failed[-1].error}")


# --------------------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------------------


def _container(resources: Mapping[str, str]) -> Container:
    return Container(name="main", limits=dict(resources))


@_check(
    "requests are read from resources as the fixture's examples say",
    hooks=("hami_container_request",),
    material=lambda f: bool(f.requests),
    needs="`requests` (RequestCase examples)",
)
def check_requests_from_resources(fixture: VendorFixture, plugins: VendorPlugins) -> None:
    for case in fixture.requests:
        pod = Pod(name="request-check", annotations=dict(case.annotations), containers=(_container(case.resources),))
        try:
            got = plugins.container_request(case.kind, pod.containers[0], pod)
        except RequestError as exc:
            if isinstance(case.expect, str) and case.expect in str(exc):
                continue
            raise _fail(f"{dict(case.resources)}: unexpected refusal {exc}") from None
        if isinstance(case.expect, str):
            raise _fail(f"{dict(case.resources)}: expected a refusal mentioning {case.expect!r}, got {got}")
        if got != case.expect:
            raise _fail(f"{dict(case.resources)}: read {got}, expected {case.expect}")


@_check("a container without device resources asks for nothing", hooks=("hami_container_request",))
def check_empty_container_asks_nothing(fixture: VendorFixture, plugins: VendorPlugins) -> None:
    for resources in ({}, {"cpu": "2", "memory": "4Gi"}):
        pod = Pod(name="empty-check", containers=(_container(resources),))
        got = plugins.pod_requests(pod)
        if got:
            raise _fail(f"a container with resources {resources} was read as asking for {got}")


@_check(
    "a memory value with a unit suffix is refused with the resource named, not misread",
    hooks=("hami_container_request",),
    material=lambda f: bool(f.requests),
    needs="`requests` (RequestCase examples)",
)
def check_unit_suffix_refused(fixture: VendorFixture, plugins: VendorPlugins) -> None:
    for kind in plugins.vendors[0].info.kinds:
        if not kind.resources.memory:
            continue
        resources = {kind.resources.count: "1", kind.resources.memory: "3Gi"}
        pod = Pod(name="unit-check", containers=(_container(resources),))
        try:
            got = plugins.container_request(kind.common_word, pod.containers[0], pod)
        except RequestError as exc:
            if kind.resources.memory not in str(exc):
                raise _fail(f"the refusal of {resources} does not name {kind.resources.memory}: {exc}") from None
            continue
        raise _fail(f"{resources} was read as {got} instead of being refused")


# --------------------------------------------------------------------------------------------------------
# Fitting
# --------------------------------------------------------------------------------------------------------


def _fit_material(fixture: VendorFixture) -> bool:
    return any(kind in fixture.nodes for kind in fixture.fit_requests)


_FIT_NEEDS = "`nodes` and `fit_requests` for the same device kind"


def _fits(plugins: VendorPlugins, kind: str, request: ContainerRequest, nodes: list[NodeView]) -> list[NodeFit]:
    pod = Pod(name="fit-check", uid="uid-fit-check", containers=(Container(name="main"),))
    fits = plugins.fit_nodes(kind, pod, [request], nodes, SchedulingPolicy())
    if sorted(f.node for f in fits) != sorted(n.name for n in nodes):
        raise _fail(f"fit answered for nodes {[f.node for f in fits]}, was asked about {[n.name for n in nodes]}")
    return fits


@_check(
    "a placement never exceeds a device's free slots, memory or cores, and gives each container its device count",
    hooks=("hami_fit_nodes",),
    material=_fit_material,
    needs=_FIT_NEEDS,
)
def check_fit_within_capacity(fixture: VendorFixture, plugins: VendorPlugins) -> None:
    for kind, requests in fixture.fit_requests.items():
        for request in requests:
            nodes = fixture.nodes[kind]()
            by_name = {n.name: {d.id: d for d in n.devices} for n in nodes}
            for fit in _fits(plugins, kind, request, nodes):
                if fit.placement is None:
                    continue
                devices = by_name[fit.node]
                (placement,) = fit.placement
                if len(placement) != request.count or len({d.uuid for d in placement}) != request.count:
                    raise _fail(f"{fit.node}: {request} got {len(placement)} distinct devices: {placement}")
                for granted in placement:
                    usage = devices.get(granted.uuid)
                    if usage is None:
                        raise _fail(f"{fit.node}: placement names device {granted.uuid}, which the node does not have")
                    _within(fit.node, usage, granted.usedmem, granted.usedcores)


def _within(node: str, usage: DeviceUsage, memory: int, cores: int) -> None:
    d = usage.device
    if usage.used + 1 > d.count:
        raise _fail(f"{node}/{d.id}: a placement takes slot {usage.used + 1} of {d.count}")
    if usage.usedmem + memory > d.devmem:
        raise _fail(f"{node}/{d.id}: {memory} MiB placed where {d.devmem - usage.usedmem} MiB are free")
    if usage.usedcores + cores > d.devcore:
        raise _fail(f"{node}/{d.id}: {cores} cores placed where {d.devcore - usage.usedcores} are free")


@_check(
    "preemption by device share frees what the vendor's own fit needs, whenever evicting can make room",
    hooks=("hami_fit_nodes",),
    material=_fit_material,
    needs=_FIT_NEEDS,
)
def check_preemption_makes_room(fixture: VendorFixture, plugins: VendorPlugins) -> None:
    """The fixture's usage as low-priority pods, and one more filling each device's memory: for each request
    no node fits then, the victims `hami.scheduler.preemption` chooses must let the vendor's fit place it, and
    when it chooses none, evicting every pod must not help either."""
    from hami.fitting import Grant
    from hami.scheduler.nodes import NodeRecord, NodeTotals
    from hami.scheduler.preemption import VictimSelector, without
    from hami.scheduler.state import ClusterState, PodRecord

    for kind, requests in fixture.fit_requests.items():
        for request in requests:
            state = ClusterState(plugins)
            for view in fixture.nodes[kind]():
                record = NodeRecord(view.name, view.annotations, view.labels, {kind: view}, totals={kind: NodeTotals()})
                state.nodes[view.name] = record
                for usage in view.devices:
                    grants = [(usage.used, usage.usedmem, usage.usedcores)]  # the fixture's own usage
                    free = usage.device.devmem - usage.usedmem
                    if usage.used < usage.device.count and free > 0:  # and a pod filling the device's memory
                        grants.append((1, free, 0))
                        usage.used, usage.usedmem = usage.used + 1, usage.device.devmem
                    for i, (slots, memory, cores) in enumerate(grants):
                        if not (slots or memory or cores):
                            continue
                        key = f"victims/{view.name}-{usage.device.id}-{i}"
                        grant = Grant(max(slots, 1), memory, cores)
                        state.pods[key] = PodRecord(
                            key, f"uid-{key}", view.name, 0, {}, grants={kind: {usage.device.id: grant}}
                        )
                        record.pods.add(key)
            pod = Pod(name="urgent", uid="uid-urgent", containers=(Container(name="main"),), priority=1)
            names = sorted(state.nodes)
            views = [state.nodes[n].views[kind] for n in names]
            if any(f.placement is not None for f in plugins.fit_nodes(kind, pod, [request], views, SchedulingPolicy())):
                continue  # fits as is: the filter places it, nobody is preempted
            choice = VictimSelector(plugins, state).select(pod, {kind: [request]}, SchedulingPolicy(), names)
            if choice is not None:
                freed = without(state.nodes[choice.node], kind, list(choice.victims))
                (fit,) = plugins.fit_nodes(kind, pod, [request], [freed], SchedulingPolicy())
                if fit.placement is None:
                    raise _fail(f"{request}: evicting {[v.key for v in choice.victims]} on {choice.node} "
                                f"leaves it refused: {fit.reason}")  # fmt: skip
                continue
            for name in names:
                everyone = [state.pods[k] for k in state.nodes[name].pods]
                (fit,) = plugins.fit_nodes(kind, pod, [request], [without(state.nodes[name], kind, everyone)],
                                        SchedulingPolicy())  # fmt: skip
                if fit.placement is not None:
                    raise _fail(f"{request}: no preemption chosen, yet evicting every pod of {name} makes room")


@_check(
    "which nodes fit does not depend on the order devices are listed in",
    hooks=("hami_fit_nodes",),
    material=_fit_material,
    needs=_FIT_NEEDS,
)
def check_fit_order_independent(fixture: VendorFixture, plugins: VendorPlugins) -> None:
    rng = random.Random(20261130)
    for kind, requests in fixture.fit_requests.items():
        for request in requests:
            baseline = {f.node: f.fits for f in _fits(plugins, kind, request, fixture.nodes[kind]())}
            for _ in range(3):
                nodes = fixture.nodes[kind]()
                for node in nodes:
                    rng.shuffle(node.devices)
                shuffled = {f.node: f.fits for f in _fits(plugins, kind, request, nodes)}
                if shuffled != baseline:
                    changed = sorted(n for n in baseline if baseline[n] != shuffled.get(n))
                    raise _fail(f"{request}: feasibility of {changed} changed when devices were reordered")


_UNREADABLE = ("Traceback", "object at 0x", "None", "{'", "[<", "Error(")


@_check(
    "every refused node gets one short line a user can read",
    hooks=("hami_fit_nodes",),
    material=_fit_material,
    needs=_FIT_NEEDS,
)
def check_refusal_reasons_readable(fixture: VendorFixture, plugins: VendorPlugins) -> None:
    for kind in fixture.fit_requests:
        nodes = fixture.nodes[kind]()
        most = max((len(n.devices) for n in nodes), default=0)
        impossible = ContainerRequest(kind=kind, count=min(most + 1, 1024), memory_percentage=100, cores=100)
        for fit in _fits(plugins, kind, impossible, nodes):
            if fit.placement is not None:
                raise _fail(f"{fit.node} claims to fit {impossible.count} devices but has at most {most}")
            reason = fit.reason
            if not reason or "\n" in reason or len(reason) > 300 or any(s in reason for s in _UNREADABLE):
                raise _fail(f"{fit.node}: refusal reason {reason!r} is empty, multi-line, too long or a Python repr")


# --------------------------------------------------------------------------------------------------------
# Container edits
# --------------------------------------------------------------------------------------------------------


@_check(
    "container edits are deterministic: the same placement gives the same edits",
    hooks=("hami_container_edits",),
    material=lambda f: bool(f.edits),
    needs="`edits` (EditCase placements)",
)
def check_container_edits_deterministic(fixture: VendorFixture, plugins: VendorPlugins) -> None:
    for case in fixture.edits:
        first = plugins.container_edits(case.kind, case.pod, case.container_index, case.placement)
        second = plugins.container_edits(case.kind, case.pod, case.container_index, case.placement)
        if first != second:
            raise _fail(f"edits for {case.placement} differ between two calls:\n{first}\n{second}")
        for mount in first.mounts:
            if not mount.container_path.startswith("/") or not mount.host_path.startswith("/"):
                raise _fail(f"mount {mount} must use absolute paths")


# --------------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------------


NOT_IMPLEMENTED = "the vendor does not implement"


def _why_not(check: Check, fixture: VendorFixture, hooks: set[str]) -> str | None:
    """None when the check runs; else why not (starting with `NOT_IMPLEMENTED` when a hook is missing)."""
    missing = [h for h in check.hooks if h not in hooks]
    if missing:
        return f"{NOT_IMPLEMENTED} {', '.join(missing)}"
    if not check.material(fixture):
        return (
            f"the vendor implements {', '.join(check.hooks)} but the fixture gives no {check.needs}:"
            f" add them to the VendorFixture so that {check.name} runs"
        )
    return None


def applicable(fixture: VendorFixture) -> tuple[list[Check], list[tuple[Check, str]]]:
    """The checks that run on this fixture, and those that do not with why.

    A reason starting with `NOT_IMPLEMENTED` is a hook the vendor has not written (the check is skipped);
    any other names the fixture material the vendor must add (`pytest_suite` fails the check).
    """
    hooks = set(fixture.plugins().vendors[0].hooks)
    run, skipped = [], []
    for check in CHECKS:
        why = _why_not(check, fixture, hooks)
        if why is None:
            run.append(check)
        else:
            skipped.append((check, why))
    return run, skipped


def run_check(fixture: VendorFixture, name: str) -> None:
    """Run one named check; raises `ConformanceFailure` when the plugin breaks its rule."""
    for check in CHECKS:
        if check.name == name:
            check.run(fixture, fixture.plugins())
            return
    raise KeyError(f"no conformance check named {name!r}; known: {[c.name for c in CHECKS]}")


def pytest_suite(make_fixture: Callable[[], VendorFixture]) -> Callable[[str], None]:
    """A pytest test function parametrized over every check of the kit.

    In a vendor's tests: ``test_conformance = pytest_suite(my_fixture)``. A check runs when it applies; it is
    skipped, naming the hook, when the vendor does not implement what it exercises; it fails, naming the fixture
    field to fill, when the vendor implements the hook but the fixture gives it nothing to run on.
    """
    import pytest

    @pytest.mark.parametrize("check", [c.name for c in CHECKS])
    def test_conformance(check: str) -> None:
        fixture = make_fixture()
        (found,) = (c for c in CHECKS if c.name == check)
        why = _why_not(found, fixture, set(fixture.plugins().vendors[0].hooks))
        if why is None:
            run_check(fixture, check)
        elif why.startswith(NOT_IMPLEMENTED):
            pytest.skip(f"{check}: {why}")
        else:
            raise ConformanceFailure(f"{check} did not run: {why}")

    return test_conformance
