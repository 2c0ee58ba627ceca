"""The conformance kit catches what it claims to: each check fails on a plugin that breaks its rule."""

from __future__ import annotations

import itertools
import types
from collections.abc import Sequence
from typing import Any

import pytest

from hami import hookimpl
from hami.fitting import ShareFitter
from hami.model import (
    AnnotationKeys,
    Container,
    ContainerDevice,
    ContainerEdits,
    ContainerPlacement,
    ContainerRequest,
    Device,
    DeviceKind,
    DeviceUsage,
    NodeFit,
    NodeView,
    Pod,
    ResourceNames,
    SchedulingPolicy,
    VendorInfo,
)
from hami.requests import read_share_request
from hami.testing.conformance import (
    CHECKS,
    ConformanceFailure,
    EditCase,
    RequestCase,
    VendorFixture,
    applicable,
    pytest_suite,
    run_check,
)

KIND = DeviceKind(
    common_word="KIT",
    resources=ResourceNames(count="kit.example.com/dev", memory="kit.example.com/mem", cores="kit.example.com/cores"),
    annotations=AnnotationKeys(
        node_register="hami.io/node-kit-register",
        to_allocate="hami.io/kit-devices-to-allocate",
        allocated="hami.io/kit-devices-allocated",
    ),
)
INFO = VendorInfo(name="kit", display_name="Kit", kinds=(KIND,))


@hookimpl
def info_hook() -> VendorInfo:
    return INFO


@hookimpl
def request_hook(kind: DeviceKind, container: Container) -> ContainerRequest | None:
    return read_share_request(kind, container)


@hookimpl
def fit_hook(
    kind: DeviceKind, pod: Pod, requests: Sequence[ContainerRequest | None], nodes: Sequence[NodeView]
) -> list[NodeFit]:
    return ShareFitter(kind).fit_nodes(pod, requests, nodes, SchedulingPolicy())


@hookimpl
def edits_hook(devices: ContainerPlacement) -> ContainerEdits:
    return ContainerEdits(env={"KIT_VISIBLE_DEVICES": ",".join(d.uuid for d in devices)})


GOOD_HOOKS = {
    "hami_vendor_info": info_hook,
    "hami_container_request": request_hook,
    "hami_fit_nodes": fit_hook,
    "hami_container_edits": edits_hook,
}


def plugin(**overrides: Any) -> types.ModuleType:
    mod = types.ModuleType("kit_plugin")
    for name, fn in {**GOOD_HOOKS, **overrides}.items():
        setattr(mod, name, fn)
    return mod


def nodes() -> list[NodeView]:
    def dev(i: int, used: int = 0, mem: int = 0) -> DeviceUsage:
        device = Device(id=f"KIT-{i}", index=i, count=2, devmem=1000, devcore=100, type="KIT-1")
        return DeviceUsage(device=device, used=used, usedmem=mem, usedcores=10 * used)

    return [
        NodeView(name="busy", devices=[dev(0, 1, 900), dev(1, 2, 100)]),
        NodeView(name="idle", devices=[dev(2), dev(3)]),
    ]


def fixture(p: types.ModuleType) -> VendorFixture:
    return VendorFixture(
        name="kit",
        plugin=p,
        requests=[
            RequestCase(
                "KIT",
                {"kit.example.com/dev": "1", "kit.example.com/mem": "300"},
                ContainerRequest(kind="KIT", count=1, memory=300),
            ),
            RequestCase("KIT", {"kit.example.com/mem": "3Gi"}, "write 3072"),
        ],
        nodes={"KIT": nodes},
        fit_requests={
            "KIT": [ContainerRequest(kind="KIT", count=1, memory=200), ContainerRequest(kind="KIT", count=2)]
        },
        edits=[EditCase("KIT", (ContainerDevice(uuid="KIT-2", type="KIT", usedmem=200),))],
    )


def test_a_correct_plugin_passes_every_check() -> None:
    f = fixture(plugin())
    run, skipped = applicable(f)
    assert [c.name for c in run] == [c.name for c in CHECKS]
    assert skipped == []
    for check in run:
        run_check(f, check.name)


def test_checks_that_need_unimplemented_hooks_do_not_apply() -> None:
    f = fixture(plugin())
    f.plugin = types.ModuleType("bare")
    f.plugin.hami_vendor_info = info_hook  # type: ignore[attr-defined]
    run, skipped = applicable(f)
    assert [c.name for c in run] == ["hooks_match_contract", "metadata_complete", "metadata_unique"]
    assert all("does not implement" in why for _, why in skipped)


def failing(check: str, p: types.ModuleType) -> str:
    with pytest.raises(ConformanceFailure) as caught:
        run_check(fixture(p), check)
    return str(caught.value)


def test_overbooking_fit_fails_fit_within_capacity() -> None:
    @hookimpl
    def greedy(nodes: Sequence[NodeView], requests: Sequence[ContainerRequest | None]) -> list[NodeFit]:
        request = requests[0]
        assert request is not None
        return [
            NodeFit(
                node=n.name,
                placement=(
                    (
                        *(
                            ContainerDevice(uuid=d.id, type="KIT", usedmem=request.memory)
                            for d in n.devices[: request.count]
                        ),
                    ),
                ),
            )
            for n in nodes
        ]

    assert failing("fit_within_capacity", plugin(hami_fit_nodes=greedy)).startswith("busy/KIT-")


def test_order_dependent_fit_fails_fit_order_independent() -> None:
    @hookimpl
    def first_device_only(nodes: Sequence[NodeView]) -> list[NodeFit]:
        return [
            NodeFit(node=n.name, placement=((ContainerDevice(uuid=n.devices[0].id, type="KIT"),),))
            if n.devices[0].usedmem < 500
            else NodeFit(node=n.name, reason="first device busy")
            for n in nodes
        ]

    assert "changed when devices were reordered" in failing(
        "fit_order_independent", plugin(hami_fit_nodes=first_device_only)
    )


def test_python_repr_as_reason_fails_refusal_reasons_readable() -> None:
    @hookimpl
    def rude(nodes: Sequence[NodeView]) -> list[NodeFit]:
        return [NodeFit(node=n.name, reason=f"{n.devices!r}") for n in nodes]

    assert "Python repr" in failing("refusal_reasons_readable", plugin(hami_fit_nodes=rude))


def test_fit_that_forgets_a_node_fails() -> None:
    @hookimpl
    def forgetful(nodes: Sequence[NodeView]) -> list[NodeFit]:
        return [NodeFit(node=nodes[0].name, reason="only looked at one")]

    assert "was asked about" in failing("fit_within_capacity", plugin(hami_fit_nodes=forgetful))


def test_nondeterministic_edits_fail_container_edits_deterministic() -> None:
    counter = itertools.count()

    @hookimpl
    def drifting() -> ContainerEdits:
        return ContainerEdits(env={"CALL": str(next(counter))})

    assert "differ between two calls" in failing("container_edits_deterministic", plugin(hami_container_edits=drifting))


def test_reading_a_unit_suffix_as_a_number_fails_unit_suffix_refused() -> None:
    @hookimpl
    def lenient(kind: DeviceKind, container: Container) -> ContainerRequest | None:
        raw = container.resource(kind.resources.memory or "")
        return ContainerRequest(kind="KIT", count=1, memory=int(raw.rstrip("Gi")) * 1024) if raw else None

    assert "instead of being refused" in failing("unit_suffix_refused", plugin(hami_container_request=lenient))


def test_a_container_asking_for_nothing_must_get_nothing() -> None:
    @hookimpl
    def always(kind: DeviceKind) -> ContainerRequest:
        return ContainerRequest(kind=kind.common_word, count=1)

    # the core only asks about containers mentioning the kind, so this plugin survives that check …
    run_check(fixture(plugin(hami_container_request=always)), "empty_container_asks_nothing")
    # … but not the fixture's examples
    assert "read" in failing("requests_from_resources", plugin(hami_container_request=always))


def test_invalid_resource_name_fails_metadata_complete() -> None:
    bad_kind = KIND.model_copy(update={"resources": ResourceNames(count="not a resource")})

    @hookimpl
    def bad_info() -> VendorInfo:
        return VendorInfo(name="kit", display_name="Kit", kinds=(bad_kind,))

    assert "not a valid extended resource name" in failing("metadata_complete", plugin(hami_vendor_info=bad_info))


def test_clash_with_an_installed_vendor_fails_metadata_unique() -> None:
    clash = KIND.model_copy(update={"resources": ResourceNames(count="nvidia.com/gpu")})

    @hookimpl
    def clashing_info() -> VendorInfo:
        return VendorInfo(name="kit", display_name="Kit", kinds=(clash,))

    assert "nvidia.com/gpu is already claimed" in failing("metadata_unique", plugin(hami_vendor_info=clashing_info))


def test_misspelled_hook_fails_loudly() -> None:
    @hookimpl
    def hami_container_requests(kind: DeviceKind) -> None:
        return None

    assert "did you mean hami_container_request" in failing(
        "hooks_match_contract", plugin(hami_container_requests=hami_container_requests)
    )


def test_a_partial_fixture_fails_the_checks_it_gives_no_material() -> None:
    f = fixture(plugin())
    f.nodes = {}  # the plugin fits nodes, but the fixture forgot to give any
    _, skipped = applicable(f)
    reasons = {c.name: why for c, why in skipped}
    assert set(reasons) == {
        "fit_within_capacity", "fit_order_independent", "refusal_reasons_readable", "preemption_makes_room"
    }  # fmt: skip
    assert all("`nodes` and `fit_requests`" in why for why in reasons.values())

    suite = pytest_suite(lambda: f)
    suite("requests_from_resources")  # the checks with material still run
    with pytest.raises(
        ConformanceFailure, match="fit_within_capacity did not run: the vendor implements hami_fit_nodes"
    ):
        suite("fit_within_capacity")


def test_a_check_for_an_unimplemented_hook_is_reported_as_skipped_with_the_hook() -> None:
    bare = types.ModuleType("bare")
    bare.hami_vendor_info = info_hook  # type: ignore[attr-defined]
    f = fixture(bare)
    suite = pytest_suite(lambda: f)
    suite("metadata_complete")
    with pytest.raises(pytest.skip.Exception, match="does not implement hami_fit_nodes"):
        suite("fit_within_capacity")


def test_the_suite_has_one_test_per_check_whatever_the_fixture() -> None:
    suite = pytest_suite(lambda: fixture(plugin()))
    (mark,) = [m for m in getattr(suite, "pytestmark", []) if m.name == "parametrize"]
    assert list(mark.args[1]) == [c.name for c in CHECKS]
