"""Dynamic Resource Allocation end to end: the real kube-apiserver and kube-scheduler (the pinned v1.35, with the
DRAConsumableCapacity feature gate the pinned version needs: alpha, off by default), `hami node` with
`draDriver` over NVIDIA's fake NVML as the chart's node ServiceAccount (the chart's RBAC), and the chart's
DeviceClasses.

What is proved, in order: the daemon publishes its GPUs as a ResourceSlice with shares (the API server keeps
`allowMultipleAllocations` and the request policies only with the gate on); kube-scheduler allocates claims
shaped like examples/dra/ with consumable capacity, two claims share one GPU within its memory and a third is
refused; the plugin, called as the kubelet calls it (the registration socket's `GetInfo`, then
`NodePrepareResources` on the endpoint it names), answers with CDI devices whose spec files carry the grant:
the memory and core limits of the share in env, the isolation library and its preload, the grant file the
daemon wrote; two GPUs on one NUMA node go to one claim; the HAMi scheduler counts the claims, and the plugin
refuses a share on a GPU a device-plugin pod holds; a GPU that fails leaves the slice; the chart's admission
policy keeps a node daemon's token from publishing devices for another node.

This module runs its own control plane (the session's has no DRA gate) and no controller-manager: claims are
created directly (a template needs the resourceclaim controller), and the test removes a claim's
delete-protection finalizer as that controller would once its pod is gone.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import urllib3
import yaml
from control_plane import ROOT, Binaries, ControlPlane, Process, free_port, render_chart, wait_until
from e2e_kubelet import NodeKubelet
from hami_stack import build_fake_nvml, gpu_box
from kube_rest import ApiError, KubeApi, path_of

from hami.cluster.kube import KubeCluster
from hami.codec import encode_pod_devices
from hami.dra.proto import dra_pb2 as pb
from hami.dra.proto import dra_pb2_grpc as pb_grpc
from hami.dra.proto import pluginregistration_pb2 as reg
from hami.dra.proto import pluginregistration_pb2_grpc as reg_grpc
from hami.model import ContainerDevice
from hami.plugins import VendorPlugins
from hami.quantity import memory_mib
from hami.scheduler.extender import ExtenderSettings
from hami.scheduler.service import SchedulerService

pytestmark = pytest.mark.e2e

GATES = "--feature-gates=DRAConsumableCapacity=true"
DRIVER = "hami.io"
NODE = "dra-node"
OTHER_VENDORS = "ascend,cambricon,hygon,iluvatar,mthreads,metax"
EXAMPLES = ROOT / "examples" / "dra"


@dataclass
class DraWorld:
    plane: ControlPlane
    admin: KubeApi
    root: Path
    uuids: list[str]
    daemon: Process
    scheduler: Process

    def diagnose(self) -> str:
        return self.plane.diagnose()


def _scheduler_config(plane: ControlPlane, path: Path) -> Path:
    admin = plane.identities["admin"].kubeconfig
    path.write_text(
        yaml.safe_dump({
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(admin)},
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": "default-scheduler"}],
        })
    )  # fmt: skip
    return path


@pytest.fixture(scope="module")
def dra(binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraWorld]:
    work = tmp_path_factory.mktemp("dra")
    plane = ControlPlane(binaries, work / "cluster", apiserver_args=[GATES]).start()
    kubelet: NodeKubelet | None = None
    try:
        assert plane.admin is not None
        admin = plane.admin
        config = _scheduler_config(plane, work / "kube-scheduler.yaml")
        scheduler = plane.start_process(
            "kube-scheduler", [str(binaries.kube_scheduler), f"--config={config}", "--secure-port=0", GATES, "--v=3"],
            env={"GOMAXPROCS": "1"},
        )  # fmt: skip
        chart = render_chart(
            binaries.helm, ROOT / "charts" / "hami", "hami", "hami-system", binaries.kubernetes_version,
            **{"dra.enabled": "true"},
        )  # fmt: skip
        classes = [o for o in chart if o["kind"] == "DeviceClass"]
        assert "nvidia.hami.io" in {c["metadata"]["name"] for c in classes}
        for obj in classes:
            admin.create(obj)
        # the daemon runs as the chart's node ServiceAccount, with the chart's RBAC for DRA and nothing more
        for obj in chart:
            if obj["kind"] in ("ClusterRole", "ClusterRoleBinding") and obj["metadata"]["name"] == "hami-node":
                admin.create(obj)
            if obj["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
                admin.create(obj)
        node_identity = plane.service_account("hami-system", "hami-node")

        kubelet = NodeKubelet(admin, NODE).start()
        root = work / "node"
        box = gpu_box("d1", 2)
        (root / "sys").mkdir(parents=True)
        nvml = root / "nvml.json"
        nvml.write_text(json.dumps(box))
        for device in box["devices"]:
            numa = root / "sys" / "bus" / "pci" / "devices" / device["bus_id"].lower()[4:] / "numa_node"
            numa.parent.mkdir(parents=True, exist_ok=True)
            numa.write_text("0\n")
        hami_config = {
            "node": {
                "draDriver": DRIVER,
                "draPluginDir": str(root / "plugins"),
                "pluginRegistryDir": str(root / "plugins_registry"),
                "cdiDir": str(root / "cdi"),
            },
            "vendors": {
                "nvidia": {
                    "nvmlLibrary": str(build_fake_nvml(work / "fake-nvml")),
                    "sysfsRoot": str(root / "sys"),
                    "hookPath": str(root / "usr"),
                    "deviceSplitCount": 10,
                }
            },
        }
        path = root / "hami-node.yaml"
        path.write_text(yaml.safe_dump(hami_config))
        argv = [sys.executable, "-m", "hami.node", "--config", str(path), "--node-name", NODE]
        argv += ["--kubeconfig", str(node_identity.kubeconfig)]
        argv += ["--device-plugin-dir", str(kubelet.devices.directory), "--hook-dir", str(root / "hook")]
        argv += [
            "--metrics-listen",
            f"127.0.0.1:{free_port()}",
            "--discovery-interval",
            "1",
            "--register-interval",
            "1",
        ]
        env = {
            "FAKE_NVML_CONFIG": str(nvml),
            "FAKE_NVML_LOG": str(root / "nvml.log"),
            "FAKE_NVML_EVENTS": str(root / "nvml.events"),
            "HAMI_DISABLED_VENDORS": OTHER_VENDORS,
        }
        daemon = plane.start_process("hami-node", argv, env=env)
        world = DraWorld(plane, admin, root, [d["uuid"] for d in box["devices"]], daemon, scheduler)

        def published() -> bool:
            if not daemon.alive:
                raise RuntimeError(f"hami node exited\n{daemon.tail()}")
            if not scheduler.alive:
                raise RuntimeError(f"kube-scheduler exited\n{scheduler.tail()}")
            try:
                return len(admin.get("ResourceSlice", f"{NODE}-hami-io")["spec"].get("devices") or []) == 2
            except ApiError as exc:
                if exc.status == 404:
                    return False
                raise

        wait_until(published, 60, "the node's ResourceSlice with 2 GPUs", plane.diagnose)
        yield world
    finally:
        if kubelet is not None:
            kubelet.stop()
        plane.stop()


# ------------------------------------------------------------------------------------------ helpers


def _namespace(world: DraWorld, name: str) -> str:
    world.admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def _template_spec(example: str) -> dict[str, Any]:
    """The claim spec of the example's ResourceClaimTemplate."""
    docs = list(yaml.safe_load_all((EXAMPLES / example).read_text()))
    [template] = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
    spec: dict[str, Any] = template["spec"]["spec"]
    return spec


def _claim(world: DraWorld, ns: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return world.admin.create(
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
         "spec": spec}
    )  # fmt: skip


def _pod(world: DraWorld, ns: str, name: str, claim: str) -> dict[str, Any]:
    return world.admin.create({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{"name": "cuda", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    })  # fmt: skip


def _allocated(world: DraWorld, ns: str, name: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        claim = world.admin.get("ResourceClaim", name, ns)
        return claim if (claim.get("status") or {}).get("allocation") else None

    result: dict[str, Any] = wait_until(done, 60, f"claim {ns}/{name} allocated", world.diagnose)
    return result


def _unschedulable(world: DraWorld, ns: str, name: str) -> str:
    def reason() -> str | None:
        pod = world.admin.get("Pod", name, ns)
        for condition in (pod.get("status") or {}).get("conditions") or ():
            if condition["type"] == "PodScheduled" and condition["status"] == "False":
                return str(condition.get("message") or condition.get("reason"))
        return None

    message: str = wait_until(reason, 60, f"pod {ns}/{name} found unschedulable", world.diagnose)
    return message


def _kubelet_endpoint(world: DraWorld) -> str:
    """What the kubelet's plugin watcher does: find the driver's registration socket, ask it for the endpoint."""
    registration = world.root / "plugins_registry" / f"{DRIVER}-reg.sock"
    wait_until(registration.exists, 30, "the DRA registration socket", world.diagnose)
    with grpc.insecure_channel(f"unix://{registration}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        info = stub.GetInfo(reg.InfoRequest(), timeout=10)
        assert info.type == "DRAPlugin"
        assert info.name == DRIVER
        assert "v1.DRAPlugin" in info.supported_versions
        stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=10)
    return str(info.endpoint)


def _call(world: DraWorld, method: str, claims: list[dict[str, Any]]) -> Any:
    """`NodePrepareResources` or `NodeUnprepareResources` on the endpoint the registration named."""
    with grpc.insecure_channel(f"unix://{_kubelet_endpoint(world)}") as channel:
        refs = [
            pb.Claim(namespace=c["metadata"]["namespace"], name=c["metadata"]["name"], uid=c["metadata"]["uid"])
            for c in claims
        ]
        request = getattr(pb, f"{method}Request")(claims=refs)
        return getattr(pb_grpc.DRAPluginStub(channel), method)(request, timeout=30)


def _prepare(world: DraWorld, claims: list[dict[str, Any]]) -> Any:
    return _call(world, "NodePrepareResources", claims)


def _unprepare(world: DraWorld, claims: list[dict[str, Any]]) -> Any:
    return _call(world, "NodeUnprepareResources", claims)


def _cdi_edits(world: DraWorld, cdi_id: str) -> dict[str, Any]:
    """The container edits the runtime would apply for a CDI device name, read from the spec files."""
    kind, _, name = cdi_id.partition("=")
    for path in sorted((world.root / "cdi").glob("*.json")):
        spec = json.loads(path.read_text())
        if spec["kind"] == kind:
            for device in spec["devices"]:
                if device["name"] == name:
                    edits: dict[str, Any] = device["containerEdits"]
                    return edits
    raise AssertionError(f"no CDI spec under {world.root / 'cdi'} defines {cdi_id}")


def _release(world: DraWorld, ns: str, pods: list[str], claims: list[str]) -> None:
    """Delete pods and claims as the kubelet and the resourceclaim controller would let them go."""
    for pod in pods:
        world.admin.delete("Pod", pod, ns, grace=0)
    for claim in claims:
        world.admin.merge_patch("ResourceClaim", claim, {"metadata": {"finalizers": None}}, ns)
        world.admin.delete("ResourceClaim", claim, ns)

    def gone() -> bool:
        left = {c["metadata"]["name"] for c in world.admin.list("ResourceClaim", ns).get("items") or ()}
        return not left.intersection(claims)

    wait_until(gone, 30, f"claims {claims} of {ns} gone", world.diagnose)


# ------------------------------------------------------------------------------------------ tests


def test_the_node_publishes_its_gpus_as_shared_devices(dra: DraWorld) -> None:
    spec = dra.admin.get("ResourceSlice", f"{NODE}-hami-io")["spec"]
    assert spec["driver"] == DRIVER
    assert spec["nodeName"] == NODE
    assert spec["pool"]["name"] == NODE
    devices = {d["name"]: d for d in spec["devices"]}
    assert sorted(devices) == ["nvidia-0", "nvidia-1"]
    first = devices["nvidia-0"]
    attributes = {k: next(iter(v.values())) for k, v in first["attributes"].items()}
    assert attributes == {
        "kind": "NVIDIA", "vendor": "nvidia", "model": attributes["model"], "uuid": dra.uuids[0], "index": 0, "numa": 0,
    }  # fmt: skip
    assert "V100" in attributes["model"]
    # kept by the API server only with DRAConsumableCapacity on: without the gate they are dropped
    assert first["allowMultipleAllocations"] is True
    memory = first["capacity"]["hami.io/memory"]
    assert memory["value"] == "16Gi"
    assert memory["requestPolicy"]["validRange"]["step"] == "1Mi"
    assert first["capacity"]["hami.io/shares"]["value"] == "10"


def test_two_claims_share_one_gpu_within_its_memory_and_a_third_is_refused(dra: DraWorld) -> None:
    ns = _namespace(dra, "dra-share")
    spec = _template_spec("share.yaml")
    request = spec["devices"]["requests"][0]
    request["exactly"]["capacity"]["requests"]["hami.io/memory"] = "6Gi"
    request["exactly"]["selectors"] = [
        {"cel": {"expression": f'device.attributes["hami.io"].uuid == "{dra.uuids[0]}"'}}
    ]
    names = ["a", "b", "c"]
    for name in names:
        _claim(dra, ns, f"claim-{name}", spec)
        _pod(dra, ns, f"pod-{name}", f"claim-{name}")
    a, b = (_allocated(dra, ns, f"claim-{n}") for n in "ab")
    results = [c["status"]["allocation"]["devices"]["results"][0] for c in (a, b)]
    assert {r["device"] for r in results} == {"nvidia-0"}
    assert results[0]["shareID"] != results[1]["shareID"]
    for r in results:
        consumed = {k.removeprefix("hami.io/"): v for k, v in r["consumedCapacity"].items()}
        assert consumed == {"memory": "6Gi", "cores": "30", "shares": "1"}
    # 6 + 6 + 6 GiB do not fit in 16 GiB: kube-scheduler leaves the third pod unscheduled, its claim unallocated
    message = _unschedulable(dra, ns, "pod-c")
    assert "claim" in message
    assert not (dra.admin.get("ResourceClaim", "claim-c", ns).get("status") or {}).get("allocation")

    # one accounting: the HAMi scheduler, watching the real API, counts the two shares on the GPU
    service = SchedulerService(
        KubeCluster.from_kubeconfig(str(dra.plane.identities["admin"].kubeconfig), component="hami-scheduler"),
        VendorPlugins.load(disabled=OTHER_VENDORS.split(",")),
        ExtenderSettings(dra_driver=DRIVER, handshake_interval_seconds=0),
        placement_keys=None,
    ).start()
    try:
        wait_until(
            lambda: service.state.usage_snapshot().get(NODE, {}).get("NVIDIA", {}).get(dra.uuids[0]) == (2, 12288, 60),
            30, "the HAMi scheduler counting both claims' shares", dra.diagnose,
        )  # fmt: skip
    finally:
        service.stop()

    answers = _prepare(dra, [a, b]).claims
    for claim in (a, b):
        answer = answers[claim["metadata"]["uid"]]
        assert answer.error == ""
        [device] = answer.devices
        assert (device.pool_name, device.device_name) == (NODE, "nvidia-0")
        cdi_id = device.cdi_device_ids[0]
        assert cdi_id == f"hami.io/claim={claim['metadata']['uid']}-nvidia"
        edits = _cdi_edits(dra, cdi_id)
        env = dict(e.split("=", 1) for e in edits["env"])
        assert env["NVIDIA_VISIBLE_DEVICES"] == dra.uuids[0]
        assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "6144m"
        assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
        mounts = {m["containerPath"]: m for m in edits["mounts"]}
        assert "/etc/ld.so.preload" in mounts
        assert "ro" in mounts["/etc/ld.so.preload"]["options"]
        missing = [m["hostPath"] for m in edits["mounts"] if not Path(m["hostPath"]).exists()]
        assert not missing, f"the runtime cannot bind-mount what is not on the host: {missing}"
        grants = [m for m in edits["mounts"] if "/grants/" in m["hostPath"]]
        assert len(grants) == 1
        assert any(Path(grants[0]["hostPath"]).iterdir()), "the grant the daemon wrote is in the mounted directory"

    done = _unprepare(dra, [a, b]).claims
    assert all(done[c["metadata"]["uid"]].error == "" for c in (a, b))
    assert not list((dra.root / "cdi").glob("*.json"))
    _release(dra, ns, [f"pod-{n}" for n in names], [f"claim-{n}" for n in names])


def test_the_examples_are_valid_and_two_gpus_on_one_numa_node_go_to_one_claim(dra: DraWorld) -> None:
    ns = _namespace(dra, "dra-examples")
    for example in ("share.yaml", "whole.yaml", "numa-pair.yaml"):
        for doc in yaml.safe_load_all((EXAMPLES / example).read_text()):
            if doc["kind"] == "ResourceClaimTemplate":
                dra.admin.create({**doc, "metadata": {**doc["metadata"], "namespace": ns}})
    _claim(dra, ns, "pair", _template_spec("numa-pair.yaml"))
    _pod(dra, ns, "pod-pair", "pair")
    claim = _allocated(dra, ns, "pair")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert sorted(r["device"] for r in results) == ["nvidia-0", "nvidia-1"]
    answer = _prepare(dra, [claim]).claims[claim["metadata"]["uid"]]
    assert answer.error == ""
    assert len(answer.devices) == 2
    assert len({d.cdi_device_ids[0] for d in answer.devices}) == 1  # one CDI device carries both GPUs
    env = dict(e.split("=", 1) for e in _cdi_edits(dra, answer.devices[0].cdi_device_ids[0])["env"])
    assert sorted(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(dra.uuids)
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == env["CUDA_DEVICE_MEMORY_LIMIT_1"] == "8192m"
    _unprepare(dra, [claim])

    # a whole GPU: all its cores asked for, its memory taken whole by the policy's default; the GPUs each have
    # 8 GiB held by the pair until it is released
    _claim(dra, ns, "whole", _template_spec("whole.yaml"))
    _pod(dra, ns, "pod-whole", "whole")
    assert "claim" in _unschedulable(dra, ns, "pod-whole")
    _release(dra, ns, ["pod-pair"], ["pair"])
    # kube-scheduler retries an unschedulable pod on its own only after minutes; a new pod is tried at once
    dra.admin.delete("Pod", "pod-whole", ns, grace=0)
    wait_until(lambda: not dra.admin.list("Pod", ns).get("items"), 30, f"pods of {ns} gone")
    _pod(dra, ns, "pod-whole", "whole")
    whole = _allocated(dra, ns, "whole")
    consumed = whole["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]
    assert {k.removeprefix("hami.io/"): v for k, v in consumed.items()}["memory"] == "16Gi"
    answer = _prepare(dra, [whole]).claims[whole["metadata"]["uid"]]
    env = dict(e.split("=", 1) for e in _cdi_edits(dra, answer.devices[0].cdi_device_ids[0])["env"])
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "16384m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "100"
    _unprepare(dra, [whole])
    assert os.listdir(dra.root / "cdi") == []


def test_the_plugin_refuses_a_share_the_extender_gave_to_a_device_plugin_pod(dra: DraWorld) -> None:
    """kube-scheduler does not know what HAMi's extender placed through the device plugin; the plugin does."""
    ns = _namespace(dra, "dra-accounting")
    kind = VendorPlugins.load(disabled=OTHER_VENDORS.split(",")).kind("NVIDIA")
    held = encode_pod_devices([(ContainerDevice(uuid=dra.uuids[1], type="NVIDIA", usedmem=14000, usedcores=20),)])
    dra.admin.create({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "device-plugin-pod", "namespace": ns, "annotations": {kind.annotations.allocated: held}},
        "spec": {"nodeName": NODE, "containers": [{"name": "cuda", "image": "cuda"}]},
    })  # fmt: skip
    spec = _template_spec("share.yaml")
    request = spec["devices"]["requests"][0]
    second_gpu = f'device.attributes["hami.io"].uuid == "{dra.uuids[1]}"'
    request["exactly"]["selectors"] = [{"cel": {"expression": second_gpu}}]
    _claim(dra, ns, "late", spec)
    _pod(dra, ns, "pod-late", "late")
    claim = _allocated(dra, ns, "late")
    answer = _prepare(dra, [claim]).claims[claim["metadata"]["uid"]]
    assert f"pod {ns}/device-plugin-pod" in answer.error
    assert "2384 MiB free" in answer.error
    assert not answer.devices
    assert not list((dra.root / "cdi").glob("*.json"))
    dra.admin.delete("Pod", "device-plugin-pod", ns, grace=0)
    _release(dra, ns, ["pod-late"], ["late"])


def test_a_node_daemons_token_may_publish_only_its_own_nodes_devices(dra: DraWorld) -> None:
    """The chart's admission policy: the daemon of one node, its container in a tenant's hands, tries to publish
    devices for another node (to draw claims there, or hide that node's devices behind a forged pool)."""
    admin = dra.admin
    admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hami-system"}})
    admin.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "hami-node",
                  "namespace": "hami-system"}})  # fmt: skip
    pod = admin.create({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hami-node-daemon", "namespace": "hami-system"},
        "spec": {"nodeName": NODE, "serviceAccountName": "hami-node", "automountServiceAccountToken": False,
                 "containers": [{"name": "hami", "image": "hami"}]},
    })  # fmt: skip
    request = {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600, "boundObjectRef": {
            "apiVersion": "v1", "kind": "Pod", "name": "hami-node-daemon", "uid": pod["metadata"]["uid"]}},
    }  # fmt: skip
    token = admin.request("POST", path_of("ServiceAccount", "hami-node", "hami-system", sub="token"), request)
    context = ssl.create_default_context(cafile=str(dra.plane.pki.ca))
    http = urllib3.PoolManager(ssl_context=context, retries=False)

    def publish(node: str) -> tuple[int, str]:
        body = {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-forged"},
            "spec": {"driver": "forged.example", "nodeName": node, "pool": {
                "name": node, "generation": 1, "resourceSliceCount": 1}, "devices": []},
        }  # fmt: skip
        answer = http.request(
            "POST", dra.plane.server + path_of("ResourceSlice"), body=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token['status']['token']}", "Content-Type": "application/json"},
        )  # fmt: skip
        return int(answer.status), answer.data.decode(errors="replace")

    admin.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "other-node"}})
    status, message = publish("other-node")
    assert status == 403
    assert f"the HAMi node daemon of node {NODE} may publish only its own node's devices" in message
    assert publish(NODE)[0] == 201
    admin.delete("ResourceSlice", f"{NODE}-forged")


def test_a_gpu_that_fails_leaves_the_slice(dra: DraWorld) -> None:
    """Runs last: the GPU stays failed. An XID 79 (fallen off the bus) from the driver marks GPU 1 unhealthy;
    the next discovery publishes the slice without it, in a new pool generation."""
    before = dra.admin.get("ResourceSlice", f"{NODE}-hami-io")["spec"]["pool"]["generation"]
    # the earlier tests ran through many syncs (one a second): what the server stored was never taken for a change
    assert before == 1
    with (dra.root / "nvml.events").open("a") as events:
        events.write("1 79\n")

    def without_gpu_1() -> dict[str, Any] | None:
        spec: dict[str, Any] = dra.admin.get("ResourceSlice", f"{NODE}-hami-io")["spec"]
        return spec if [d["name"] for d in spec["devices"]] == ["nvidia-0"] else None

    spec = wait_until(without_gpu_1, 60, "the failed GPU gone from the slice", dra.diagnose)
    assert spec["pool"]["generation"] > before


# ------------------------------------------------------------------------------------------ every vendor

SIM_NODE = "dra-every-vendor"
SIMULATED = {
    "nodes": [{
        "name": SIM_NODE,
        "annotations": {"hami.io/dcu-mode": "vdcu", "hami.io/iluvatar-mode": "gpu-manager"},
        "devices": [
            {"kind": "Ascend910B3", "type": "Ascend910B3", "id": "NPU-dra", "devmem": 65536, "devcore": 20,
             "count": 4, "custominfo": {"NetworkID": 0}, "driver": [{"phyId": 0}]},
            {"kind": "MLU", "type": "MLU370-X8", "id": "MLU-dra-0", "devmem": 24576, "count": 100},
            {"kind": "DCU", "type": "Z100L", "id": "DCU-dra", "devmem": 65536, "count": 4,
             "driver": [{"bdf": "0000:31:00.0", "drmCard": "card0", "drmRender": "renderD128"}]},
            {"kind": "BI-V150", "type": "BI-V150", "id": "GPU-dra-ix", "devmem": 32768, "count": 10,
             "driver": [{"minor": 0, "busId": "0000:8a:00.0"}]},
            {"kind": "Mthreads", "type": "Mthreads-MTT-S4000", "id": "GPU-dra-mt-0", "devmem": 49152, "devcore": 16,
             "count": 100},
            {"kind": "Metax-SGPU", "type": "Metax-SGPU", "id": "GPU-dra-mx-0", "devmem": 65536, "count": 16,
             "custominfo": {"LinkZone": 1}},
        ],
    }]
}  # fmt: skip
"""One device of every vendor but NVIDIA (the fake-NVML node's), described as each vendor's discovery registers it
and with the facts its Allocate reads from the driver (examples/demo-inventory.yaml has the same, explained)."""


def _rounded_up(policy: dict[str, Any], mib: int) -> int:
    """What kube-scheduler consumes of a published memory policy for a request of `mib`: the next valid value, or
    the request rounded up to the range's step."""
    sizes = sorted(memory_mib(v) for v in policy.get("validValues") or ())
    if sizes:
        return next(s for s in sizes if s >= mib)
    step = memory_mib(policy["validRange"]["step"])
    return max(memory_mib(policy["validRange"]["min"]), -(-mib // step) * step)


def test_every_vendor_publishes_shares_that_kube_scheduler_allocates_and_the_plugin_prepares(
    dra: DraWorld, binaries: Binaries
) -> None:
    """Runs after the NVIDIA tests (its node has no NVIDIA device, so it takes nothing of theirs). A second node
    daemon serves one simulated device of each other vendor through that vendor's own hooks: the chart has a
    DeviceClass for every kind of every vendor, the API server accepts the slice with each vendor's share policy,
    kube-scheduler allocates a 1 GiB share of each kind (rounded up as the vendor's fitting allows: its memory
    step, or the next Ascend vNPU template), and the plugin prepares each share into CDI edits from that vendor's
    allocation and container-edits hooks."""
    plugins = VendorPlugins.load()
    vendors = {v.name: v for v in plugins.vendors if v.name in {*OTHER_VENDORS.split(","), "nvidia"}}
    assert len(vendors) == 7, sorted(vendors)
    # the vendors this test does not exercise (whole-card kinds without shares) are switched off in the chart
    others = {v.name for v in plugins.vendors} - set(vendors) - {"exampleaccel"}
    chart = render_chart(
        binaries.helm, ROOT / "charts" / "hami", "hami", "hami-system", binaries.kubernetes_version,
        **{"dra.enabled": "true", **{f"vendors.{v}.enabled": "true" for v in vendors},
           **{f"vendors.{v}.enabled": "false" for v in others}},
    )  # fmt: skip
    classes = {o["metadata"]["name"]: o for o in chart if o["kind"] == "DeviceClass"}
    kinds = {k.common_word for k in plugins.kinds if plugins.owner(k.common_word).name in vendors}
    assert set(classes) == {f"{k.lower()}.hami.io" for k in kinds}, "one DeviceClass per kind of every vendor"
    for obj in classes.values():
        dra.admin.apply(obj)

    root = dra.root.parent / "every-vendor"
    root.mkdir()
    (root / "inventory.yaml").write_text(yaml.safe_dump(SIMULATED))
    config = {
        "node": {"draDriver": DRIVER, "draPluginDir": str(root / "plugins"),
                 "pluginRegistryDir": str(root / "plugins_registry"), "cdiDir": str(root / "cdi")},
        "vendors": {
            "ascend": {"hookPath": str(root / "ascend")}, "cambricon": {"hookPath": str(root / "cambricon")},
            "hygon": {"vdevDir": str(root / "vdev"), "exporterDir": str(root / "etc-vdev"),
                      "hookPath": str(root / "hygon")},
            "iluvatar": {"hookPath": str(root / "iluvatar")}, "mthreads": {"hookPath": str(root / "mthreads")},
            "metax": {"hookPath": str(root / "metax")}, "nvidia": {"hookPath": str(root / "nvidia")},
        },
    }  # fmt: skip
    (root / "hami-node.yaml").write_text(yaml.safe_dump(config))
    kubelet = NodeKubelet(dra.admin, SIM_NODE).start()
    node_identity = dra.plane.service_account("hami-system", "hami-node")
    argv = [sys.executable, "-m", "hami.node", "--config", str(root / "hami-node.yaml"), "--node-name", SIM_NODE,
            "--kubeconfig", str(node_identity.kubeconfig), "--simulated-inventory", str(root / "inventory.yaml"),
            "--device-plugin-dir", str(kubelet.devices.directory), "--hook-dir", str(root / "hook"),
            "--metrics-listen", f"127.0.0.1:{free_port()}", "--discovery-interval", "1"]  # fmt: skip
    daemon = dra.plane.start_process("hami-node-every-vendor", argv)
    world = DraWorld(dra.plane, dra.admin, root, [], daemon, dra.scheduler)
    try:

        def published() -> dict[str, Any] | None:
            if not daemon.alive:
                raise RuntimeError(f"hami node exited\n{daemon.tail()}")
            try:
                spec: dict[str, Any] = dra.admin.get("ResourceSlice", f"{SIM_NODE}-hami-io")["spec"]
            except ApiError as exc:
                if exc.status == 404:
                    return None
                raise
            return spec if len(spec.get("devices") or ()) == len(SIMULATED["nodes"][0]["devices"]) else None

        spec = wait_until(published, 60, "the every-vendor node's ResourceSlice", dra.diagnose)
        devices = {d["name"]: d for d in spec["devices"]}
        by_kind = {d["attributes"]["kind"]["string"]: d for d in devices.values()}
        assert {d["attributes"]["vendor"]["string"] for d in devices.values()} == set(OTHER_VENDORS.split(","))
        # the vendors' topology identifiers: Ascend's HCCS group, MetaX's MetaXLink group
        assert by_kind["Ascend910B3"]["attributes"]["networkID"] == {"int": 0}
        assert by_kind["Metax-SGPU"]["attributes"]["linkZone"] == {"int": 1}
        for device in devices.values():  # the API server kept every vendor's share policy (the gate is on)
            assert device["allowMultipleAllocations"] is True, device
            assert "requestPolicy" in device["capacity"]["hami.io/memory"], device

        ns = _namespace(dra, "dra-every-vendor")
        claims: dict[str, dict[str, Any]] = {}
        for kind in sorted(by_kind):
            name = kind.lower()
            _claim(dra, ns, name, {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": f"{kind.lower()}.hami.io", "capacity": {"requests": {"hami.io/memory": "1Gi"}},
            }}]}})  # fmt: skip
            _pod(dra, ns, f"pod-{name}", name)
            claims[kind] = _allocated(dra, ns, name)
        for kind, claim in claims.items():
            [result] = claim["status"]["allocation"]["devices"]["results"]
            assert (result["pool"], result["device"]) == (SIM_NODE, by_kind[kind]["name"])
            consumed = {k.removeprefix("hami.io/"): v for k, v in result["consumedCapacity"].items()}
            wanted = _rounded_up(by_kind[kind]["capacity"]["hami.io/memory"]["requestPolicy"], 1024)
            assert memory_mib(consumed["memory"]) == wanted, (kind, consumed)

        answers = _prepare(world, list(claims.values())).claims
        for kind, claim in claims.items():
            answer = answers[claim["metadata"]["uid"]]
            assert answer.error == "", (kind, answer.error)
            [device] = answer.devices
            assert (device.pool_name, device.device_name) == (SIM_NODE, by_kind[kind]["name"])
            assert device.share_id
            cdi_id = device.cdi_device_ids[0]
            assert cdi_id == f"hami.io/claim={claim['metadata']['uid']}-{kind.lower()}"
            edits = _cdi_edits(world, cdi_id)
            assert edits.get("env") or edits.get("deviceNodes"), (kind, edits)
            # what the daemon writes or installs (grants, accounting, the isolation library) is on the host; the
            # vendor's driver directories (/opt/hyhal, /usr/local/corex) are a real node's
            ours = [m["hostPath"] for m in edits.get("mounts") or () if m["hostPath"].startswith(str(root))]
            assert not [p for p in ours if not Path(p).exists()], (kind, edits["mounts"])
        done = _unprepare(world, list(claims.values())).claims
        assert all(done[c["metadata"]["uid"]].error == "" for c in claims.values())
        assert not list((root / "cdi").glob("*.json"))
        _release(dra, ns, [f"pod-{k.lower()}" for k in claims], [k.lower() for k in claims])
    finally:
        daemon.stop()
        kubelet.stop()
