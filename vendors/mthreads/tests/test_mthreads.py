"""The Moore Threads plugin: the conformance kit, HAMi's requests and admission (sGPU memory sizes, 16 cores per
GPU, whole multi-GPU requests), fitting (one GPU per pod, selectors by UUID or HAMi's capacity name, the pod
annotations HAMi writes) and container edits."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from hami.errors import ConfigError, HamiError, RequestError
from hami.model import (
    Container,
    ContainerDevice,
    ContainerRequest,
    Device,
    DeviceUsage,
    NodeView,
    Pod,
    RegisterFormat,
    SchedulingPolicy,
)
from hami.plugins import VendorPlugins
from hami.testing.conformance import EditCase, RequestCase, VendorFixture, pytest_suite
from hami_vendor_mthreads import plugin
from hami_vendor_mthreads.fit import GPU_INDEX, PREDICATE_NODE, PREDICATE_TIME, MthreadsFitter
from hami_vendor_mthreads.requests import REQUEST_GPU_NUM

MT = "Mthreads"
COUNT, MEMORY, CORES = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"
F = Any


def req(count: int = 1, memory: int = 0, percent: int | None = None, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(kind=MT, count=count, memory=memory, memory_percentage=percent, cores=cores)


def whole(count: int) -> ContainerRequest:
    return req(count, percent=100, cores=16)


REQUESTS = [
    RequestCase(MT, {COUNT: "1"}, whole(1)),
    RequestCase(MT, {COUNT: "1", MEMORY: "8", CORES: "4"}, req(memory=4096, cores=4)),  # 8 × 512 MiB, 4/16
    RequestCase(MT, {COUNT: "1", MEMORY: "96", CORES: "16"}, whole(1)),  # what HAMi's webhook writes for one GPU
    RequestCase(MT, {COUNT: "1", MEMORY: "96", CORES: "8"}, req(percent=100, cores=8)),
    RequestCase(MT, {COUNT: "1", CORES: "8"}, whole(1)),  # HAMi's webhook writes 16 cores over it
    RequestCase(MT, {MEMORY: "2"}, None),  # HAMi reads nothing without mthreads.com/vgpu
    RequestCase(MT, {CORES: "8"}, None),
    RequestCase(MT, {COUNT: "0", MEMORY: "4"}, "must be greater than 0"),
    # legal memory sizes only
    RequestCase(MT, {COUNT: "1", MEMORY: "3"}, "2, 4, 8, 16, 32, 64, 96"),
    RequestCase(MT, {COUNT: "1", MEMORY: "128"}, "is not an sGPU memory size"),
    RequestCase(MT, {COUNT: "1", MEMORY: "0"}, "is not an sGPU memory size"),
    RequestCase(MT, {COUNT: "1", MEMORY: "4Gi"}, "counts 512 MiB"),
    # cores in sixteenths of a GPU
    RequestCase(MT, {COUNT: "1", MEMORY: "8", CORES: "17"}, "more than 16"),
    RequestCase(MT, {COUNT: "1", CORES: "100"}, "more than 16 sixteenths of a GPU"),
    RequestCase(MT, {COUNT: "1", CORES: "half"}, "counts sixteenths of a GPU"),
    # several GPUs are whole GPUs
    RequestCase(MT, {COUNT: "2"}, whole(2)),
    RequestCase(MT, {COUNT: "2", MEMORY: "192", CORES: "32"}, whole(2)),  # what HAMi's webhook writes
    RequestCase(MT, {COUNT: "4", MEMORY: "8", CORES: "4"}, whole(4)),
    RequestCase(MT, {COUNT: "2", MEMORY: "lots"}, "plain non-negative integer"),
]


def gpu(node: str, i: int, used: int = 0, mem: int = 0, cores: int = 0, health: bool = True) -> DeviceUsage:
    device = Device(id=f"{node}-gpu-{i}", index=i, count=100, devmem=49152, devcore=16, type="Mthreads-MTT-S4000",
                    numa=i // 2, health=health)  # fmt: skip
    return DeviceUsage(device=device, used=used, usedmem=mem, usedcores=cores)


def mt_nodes() -> list[NodeView]:
    """Two nodes of four MTT S4000, one of them partly shared."""
    return [
        NodeView(name="idle", devices=[gpu("idle", i) for i in range(4)]),
        NodeView(
            name="busy",
            devices=[gpu("busy", 0, 1, 40960, 8), gpu("busy", 1, 2, 8192, 16), gpu("busy", 2), gpu("busy", 3, 1, 0, 4)],
        ),
    ]


def make_fixture() -> VendorFixture:
    return VendorFixture(
        name="mthreads",
        plugin=plugin,
        config={"mtmlLibrary": "/nonexistent/libmtml.so", "mthreadsGmi": "/nonexistent/mthreads-gmi"},
        requests=REQUESTS,
        nodes={MT: mt_nodes},
        fit_requests={MT: [req(memory=4096, cores=4), whole(1), whole(2), req(memory=16384, cores=8), whole(4)]},
        edits=[
            EditCase(MT, (ContainerDevice(uuid="idle-gpu-2", type=MT, usedmem=4096, usedcores=4),)),
            EditCase(MT, tuple(ContainerDevice(uuid=f"idle-gpu-{i}", type=MT) for i in (0, 3))),
        ],
    )


test_conformance = pytest_suite(make_fixture)


def host_of(config: Mapping[str, Any] | None = None) -> VendorPlugins:
    return VendorPlugins.from_plugins({"mthreads": plugin}, config={"mthreads": dict(config or {})})


def read(resources: Mapping[str, str], config: Mapping[str, Any] | None = None) -> ContainerRequest | None:
    container = Container(name="main", limits=dict(resources))
    return host_of(config).container_request(MT, container, Pod(name="p", containers=(container,)))


def test_metadata_is_hami_wiring() -> None:
    (kind,) = plugin.INFO.kinds
    assert kind.common_word == MT
    assert kind.register_format is RegisterFormat.CAPACITY
    assert (kind.capacity_by_cores, kind.capacity_cores_per_device) == ("mthreads", 16)
    assert kind.annotations.node_register == "hami.io/node-mthreads-register"  # this project's, see discovery
    assert kind.annotations.node_handshake is None
    assert kind.resources.memory_unit_mib == 512
    assert (kind.annotations.to_allocate, kind.annotations.allocated) == (
        "hami.io/mthreads-vgpu-devices-to-allocate",
        "hami.io/mthreads-vgpu-devices-allocated",
    )
    assert kind.annotations.selectors() == ("mthreads.ai/use-gpuuuid", "mthreads.ai/nouse-gpuuuid")


@pytest.mark.parametrize("units", plugin.LEGAL_MEMORY_UNITS[:-1])
def test_every_legal_memory_size(units: int) -> None:
    assert read({COUNT: "1", MEMORY: str(units)}) == req(memory=units * 512)


def test_illegal_memory_refusal_names_resource_and_lists_sizes() -> None:
    with pytest.raises(RequestError) as err:
        read({COUNT: "1", MEMORY: "6"})
    assert err.value.resource == MEMORY
    assert "write one of 2, 4, 8, 16, 32, 64, 96 (units of 512 MiB)" in str(err.value)


def test_default_cores_in_gpu_units() -> None:
    assert read({COUNT: "1", MEMORY: "16"}, {"defaultCores": 8}) == req(memory=8192, cores=8)
    with pytest.raises(ConfigError, match="mthreads"):
        read({COUNT: "1"}, {"defaultCores": 17})
    with pytest.raises(ConfigError, match="mthreads"):
        read({COUNT: "1"}, {"defaultMem": 1024})  # HAMi has no memory default for these GPUs


# --------------------------------------------------------------------------------------------------------
# Admission: what HAMi's webhook writes
# --------------------------------------------------------------------------------------------------------


def admit(*containers: Mapping[str, str]) -> list[Any]:
    pod = Pod(name="p", containers=tuple(Container(name=f"c{i}", limits=dict(c)) for i, c in enumerate(containers)))
    plugins = host_of()
    return [plugins.admission_defaults(MT, c, pod) for c in pod.containers]


def test_admission_writes_hamis_whole_gpu_limits() -> None:
    (one,) = admit({COUNT: "1"})
    assert dict(one.limits) == {CORES: "16", MEMORY: "96"}
    assert not one.pod_annotations
    (two,) = admit({COUNT: "2", MEMORY: "8"})
    assert dict(two.limits) == {CORES: "32", MEMORY: "192"}
    assert dict(two.pod_annotations) == {REQUEST_GPU_NUM: "2"}
    assert admit({COUNT: "1", MEMORY: "8", CORES: "4"}) == [None]


def test_admission_is_stable_when_applied_again() -> None:
    (edit,) = admit({COUNT: "3"})
    assert admit({COUNT: "3", **edit.limits})[0] == edit
    (edit,) = admit({COUNT: "1"})
    assert admit({COUNT: "1", **edit.limits}) == [None]


def test_request_gpu_num_is_the_last_multi_gpu_container() -> None:
    edits = admit({COUNT: "2"}, {COUNT: "3"})
    assert [dict(e.pod_annotations) for e in edits] == [{REQUEST_GPU_NUM: "3"}, {REQUEST_GPU_NUM: "3"}]


def test_read_after_admission_is_read_before() -> None:
    for resources in ({COUNT: "1"}, {COUNT: "2"}, {COUNT: "1", CORES: "4"}):
        (edit,) = admit(resources)
        assert read({**resources, **edit.limits}) == read(resources)


# --------------------------------------------------------------------------------------------------------
# Fitting
# --------------------------------------------------------------------------------------------------------


def fit(
    *requests: ContainerRequest | None,
    nodes: Callable[[], list[NodeView]] = mt_nodes,
    annotations: Mapping[str, str] | None = None,
    device: tuple[str, ...] = ("spread",),
) -> dict[str, Any]:
    pod = Pod(name="p", uid="u", annotations=dict(annotations or {}),
              containers=tuple(Container(name=f"c{i}") for i in range(len(requests))))  # fmt: skip
    fitter = MthreadsFitter(plugin.KIND, clock=lambda: 1764633600123456789)
    return {f.node: f for f in fitter.fit_nodes(pod, list(requests), nodes(), SchedulingPolicy(device=device))}


def test_fit_writes_hamis_pod_annotations() -> None:
    fits = fit(whole(2))
    placement = fits["idle"].placement
    assert placement is not None
    indices = sorted(int(i) for i in fits["idle"].pod_annotations[GPU_INDEX].split(","))
    uuids = sorted(d.uuid for d in placement[0])
    assert uuids == [f"idle-gpu-{i}" for i in indices]
    assert fits["idle"].pod_annotations[PREDICATE_NODE] == "idle"
    assert fits["idle"].pod_annotations[PREDICATE_TIME] == "1764633600123456789"


def test_cores_are_sixteenths() -> None:
    fits = fit(req(memory=4096, cores=12))
    busy = fits["busy"].placement
    assert busy is not None
    # busy-gpu-0 has 8/16 cores taken, busy-gpu-1 16/16: only gpu-2 and gpu-3 hold 12
    assert busy[0][0].uuid in ("busy-gpu-2", "busy-gpu-3")
    assert busy[0][0].usedcores == 12


def test_pod_containers_share_one_gpu() -> None:
    fits = fit(req(memory=8192, cores=4), req(memory=8192, cores=4))
    placement = fits["idle"].placement
    assert placement is not None
    assert placement[0][0].uuid == placement[1][0].uuid


def test_one_gpu_must_hold_every_container() -> None:
    def tight() -> list[NodeView]:
        return [NodeView(name="tight", devices=[gpu("tight", 0, 1, 32768), gpu("tight", 1, 1, 32768)])]

    fits = fit(req(memory=8192), req(memory=16384), nodes=tight)
    assert fits["tight"].placement is None
    assert "no one GPU holds all of the pod's Moore Threads containers" in fits["tight"].reason


def test_multi_gpu_container_cannot_share_its_pod() -> None:
    fits = fit(whole(2), req(memory=4096))
    assert all(f.placement is None for f in fits.values())
    assert "each must ask for one (mthreads.com/vgpu: 1)" in fits["idle"].reason


def test_selectors_take_uuids_and_hamis_capacity_names() -> None:
    fits = fit(req(memory=4096), annotations={"mthreads.ai/use-gpuuuid": "idle-mthreads-3"})
    placement = fits["idle"].placement
    assert placement is not None
    assert placement[0][0].uuid == "idle-gpu-3"
    assert fits["busy"].placement is None
    fits = fit(req(memory=4096), annotations={"mthreads.ai/nouse-gpuuuid": "idle-gpu-0,idle-mthreads-1"})
    placement = fits["idle"].placement
    assert placement is not None
    assert placement[0][0].uuid not in ("idle-gpu-0", "idle-gpu-1")


def test_unhealthy_gpu_is_not_used() -> None:
    def node() -> list[NodeView]:
        return [NodeView(name="n", devices=[gpu("n", 0, health=False), gpu("n", 1)])]

    placement = fit(whole(1), nodes=node)["n"].placement
    assert placement is not None
    assert placement[0][0].uuid == "n-gpu-1"
    assert fit(whole(2), nodes=node)["n"].placement is None


def test_topology_aware_takes_the_gpus_on_one_switch(fakes: F, mthreads_node: Any) -> None:
    gpus = fakes.s4000_server(4)
    plugins = mthreads_node(gpus).plugins()
    (inventory,) = plugins.discover()["mthreads"]
    view = NodeView(name="n", devices=[DeviceUsage(device=d) for d in inventory.devices],
                    annotations=dict(inventory.annotations))  # fmt: skip
    view.devices[0].used, view.devices[0].usedmem = 1, 4096  # spread alone would take gpu 1 and 2 or 3
    pod = Pod(name="p", containers=(Container(name="c"),))
    (got,) = plugins.fit_nodes(MT, pod, [whole(2)], [view], SchedulingPolicy(device=("spread", "topology-aware")))
    assert got.placement is not None
    assert sorted(d.uuid for d in got.placement[0]) == sorted(g.uuid for g in gpus[2:])


# --------------------------------------------------------------------------------------------------------
# Container edits
# --------------------------------------------------------------------------------------------------------


def test_container_edits_as_moore_threads_plugin(fakes: F, mthreads_node: Any) -> None:
    gpus = fakes.s4000_server(4)
    plugins = mthreads_node(gpus).plugins()
    plugins.discover()
    placement = (ContainerDevice(uuid=gpus[3].uuid, type=MT, usedmem=4096, usedcores=4),
                 ContainerDevice(uuid=gpus[1].uuid, type=MT, usedmem=4096, usedcores=4))  # fmt: skip
    edits = plugins.container_edits(MT, Pod(name="p", uid="u"), 0, placement)
    assert dict(edits.env) == {
        "MTHREADS_VISIBLE_DEVICES": "3,1",
        "MTHREADS_DRIVER_CAPABILITIES": "compute,utility",
        "MUSA_VISIBLE_DEVICES": "0,1",
    }
    assert [(d.container_path, d.host_path, d.permissions) for d in edits.devices] == [
        ("/dev/mtgpu.3", "/dev/mtgpu.3", "rw"),
        ("/dev/dri/card4", "/dev/dri/card4", "rw"),
        ("/dev/dri/renderD131", "/dev/dri/renderD131", "rw"),
        ("/dev/mtgpu.1", "/dev/mtgpu.1", "rw"),
        ("/dev/dri/card2", "/dev/dri/card2", "rw"),
        ("/dev/dri/renderD129", "/dev/dri/renderD129", "rw"),
    ]


def test_hamis_capacity_name_is_served_by_index(fakes: F, mthreads_node: Any) -> None:
    gpus = fakes.s4000_server(2)
    plugins = mthreads_node(gpus).plugins()
    edits = plugins.container_edits(MT, Pod(name="p"), 0, (ContainerDevice(uuid="node-a-mthreads-1", type=MT),))
    assert edits.env["MTHREADS_VISIBLE_DEVICES"] == "1"


def test_gmi_node_finds_drm_nodes_by_pci_address(fakes: F, mthreads_node: Any) -> None:
    gpus = fakes.s4000_server(2)
    plugins = mthreads_node(gpus).plugins("gmi")
    edits = plugins.container_edits(MT, Pod(name="p"), 0, (ContainerDevice(uuid=gpus[1].uuid, type=MT),))
    assert [d.container_path for d in edits.devices] == ["/dev/mtgpu.1", "/dev/dri/card2", "/dev/dri/renderD129"]


def test_unknown_gpu_is_refused_at_allocate(fakes: F, mthreads_node: Any) -> None:
    plugins = mthreads_node(fakes.s4000_server(1)).plugins()
    with pytest.raises(HamiError, match="is not on this node"):
        plugins.container_edits(MT, Pod(name="p"), 0, (ContainerDevice(uuid="GPU-elsewhere", type=MT),))


def test_custom_driver_capabilities() -> None:
    with pytest.raises(ConfigError, match="mthreads"):
        host_of({"driverCapabilities": "compute; rm -rf /"})


@pytest.mark.parametrize("variable", ["MTHREADS_VISIBLE_DEVICES", "MTHREADS_DRIVER_CAPABILITIES"])
def test_a_tenant_cannot_name_its_own_gpus_for_the_container_runtime(variable: str) -> None:
    # the tenant asks for a share of one GPU and tells the mthreads runtime to give it every GPU of the node
    container = Container(name="main", limits={COUNT: "1", MEMORY: "8"}, env={variable: "all"})
    pod = Pod(name="p", containers=(container,))
    edit = host_of().admission_defaults(MT, container, pod)
    assert edit is not None
    assert edit.deny is not None
    assert f"sets {variable} itself" in edit.deny


def _pod_object(env: dict[str, str] | None = None, count: str = "2") -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "musa", "resources": {"limits": {COUNT: count}}}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [container]}}


def test_the_webhook_writes_hamis_limits_and_refuses_the_tenants_runtime_env() -> None:
    from hami.webhook.admission import decide

    allowed = decide(_pod_object(), "ml", host_of())
    assert allowed.allowed, allowed.message
    ops = {op["path"]: op.get("value") for op in allowed.patch}
    assert ops["/spec/containers/0/resources/limits/mthreads.com~1sgpu-core"] == "32"
    assert ops["/spec/containers/0/resources/limits/mthreads.com~1sgpu-memory"] == "192"
    assert REQUEST_GPU_NUM in json.dumps(allowed.patch)
    denied = decide(_pod_object({"MTHREADS_VISIBLE_DEVICES": "all"}), "ml", host_of())
    assert not denied.allowed
    assert "sets MTHREADS_VISIBLE_DEVICES itself" in denied.message
