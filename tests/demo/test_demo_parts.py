"""The demo's parts on their own: the JSONPatch it applies for kube-apiserver, the example loader, its
configuration, and the loopback API server (`hami.testing.apiserver`) it runs the cluster on."""

from __future__ import annotations

import base64
import json
import stat
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami.cli import main
from hami.cluster.kube import KubeCluster
from hami.demo.examples import load_examples
from hami.demo.journey import apply_json_patch
from hami.demo.world import DemoWorld
from hami.errors import ConfigError
from hami.node.simulated import load_inventory
from hami.plugins import VendorPlugins
from hami.testing.apiserver import ClusterApiServer
from hami.webhook.admission import admit_review

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------------------------
# JSONPatch
# --------------------------------------------------------------------------------------------------------


def test_patch_operations_apply_as_rfc_6902_says() -> None:
    doc = {"a": {"b/c": 1, "list": [1, 2]}, "gone": True}
    ops = [
        {"op": "replace", "path": "/a/b~1c", "value": 2},
        {"op": "add", "path": "/a/list/-", "value": 3},
        {"op": "add", "path": "/a/list/0", "value": 0},
        {"op": "add", "path": "/a/new", "value": {"x": 1}},
        {"op": "remove", "path": "/gone"},
    ]
    assert apply_json_patch(doc, ops) == {"a": {"b/c": 2, "list": [0, 1, 2, 3], "new": {"x": 1}}}
    assert doc["gone"] is True  # the input is left as it was


@pytest.mark.parametrize(
    "op",
    [
        {"op": "move", "from": "/a", "path": "/b"},
        {"op": "replace", "path": "/missing", "value": 1},
        {"op": "add", "path": "", "value": {}},
    ],
)
def test_patches_the_demo_cannot_apply_are_refused(op: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"patch|replace|whole"):
        apply_json_patch({"a": 1}, [op])


def test_the_webhooks_patch_applies_to_the_pod_it_was_made_for() -> None:
    pod = yaml.safe_load((ROOT / "examples" / "pods" / "01-nvidia-memory.yaml").read_text())
    pod["spec"]["schedulerName"] = "default-scheduler"
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "1", "namespace": "default", "operation": "CREATE", "object": pod},
    }
    answer = admit_review(review, VendorPlugins.load())["response"]
    assert answer["allowed"], answer
    patched = apply_json_patch(pod, json.loads(base64.b64decode(answer["patch"])))
    assert patched["spec"]["schedulerName"] == "hami-scheduler"


# --------------------------------------------------------------------------------------------------------
# Examples and configuration
# --------------------------------------------------------------------------------------------------------


def test_examples_split_into_setup_objects_and_pods_in_file_order() -> None:
    examples = load_examples(ROOT / "examples" / "pods")
    names = [e.path.name for e in examples]
    assert names == sorted(names)
    quota = next(e for e in examples if e.path.name == "09-quota.yaml")
    assert [r for r, _ in quota.setup] == ["namespaces", "resourcequotas"]
    assert [p.key for p in quota.pods] == ["team-a/quota-first", "team-a/quota-second"]
    assert all("kind" not in obj for _, obj in quota.setup)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: Service\nmetadata: {name: s}\n", "is a Service: the demo plays pods"),
        ("kind: Pod\nmetadata: {generateName: p-}\n", "metadata.name is required"),
        ("- a list\n", "is not a Kubernetes object"),
    ],
)
def test_examples_the_demo_cannot_play_are_refused_with_the_file(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"bad\.yaml") as error:
        load_examples(tmp_path)
    assert message in str(error.value)


def test_a_pod_in_two_files_is_refused(tmp_path: Path) -> None:
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text("kind: Pod\nmetadata: {name: same}\nspec: {containers: []}\n")
    with pytest.raises(ConfigError, match=r"pod default/same is also in a\.yaml"):
        load_examples(tmp_path)


def world(tmp_path: Path, config: str) -> DemoWorld:
    return DemoWorld(
        inventory=load_inventory(ROOT / "examples" / "demo-inventory.yaml"),
        inventory_path=ROOT / "examples" / "demo-inventory.yaml",
        config_text=config,
        config_source="demo.yaml",
        setup=[],
        workdir=tmp_path / "work",
    )


def test_the_demo_configuration_gets_its_variables_replaced(tmp_path: Path) -> None:
    text = (ROOT / "examples" / "demo-config.yaml").read_text()
    demo = world(tmp_path, text)
    node = demo._config("gpu-node")
    assert node["vendors"]["nvidia"]["hookPath"] == f"{tmp_path / 'work'}/nodes/gpu-node/usr-local"
    assert demo.base_config["scheduler"]["nodePolicy"] == "binpack"


def test_a_bad_demo_configuration_names_the_file_and_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"demo.yaml: .*nodePolicy"):
        world(tmp_path, "scheduler: {nodePolicy: sideways}\n")


def test_an_inventory_kind_no_vendor_serves_is_warned_with_the_nearest_kind(tmp_path: Path) -> None:
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(
        "nodes:\n  - name: n1\n    devices:\n"
        "      - {kind: NVIDA, id: GPU-t4, devmem: 15360, count: 4}\n"
        "      - {kind: NVIDIA, id: GPU-a, devmem: 15360, count: 4}\n"
    )
    demo = DemoWorld(
        inventory=load_inventory(inventory),
        inventory_path=inventory,
        config_text="",
        config_source="defaults",
        setup=[],
        workdir=tmp_path / "work",
    )
    demo.plugins = VendorPlugins.load()
    (warning,) = demo._unserved_kinds()
    assert warning.startswith("  warning: inv.yaml: node n1 lists NVIDA devices, but no loaded vendor serves that kind")
    assert "(did you mean 'NVIDIA'?)" in warning


def test_the_demo_prints_the_webhooks_warnings_as_kubectl_does(capsys: pytest.CaptureFixture[str]) -> None:
    from hami.demo.cli import _print_outcome, _Printer
    from hami.demo.journey import PodOutcome

    warning = "container cuda: no hami vendor plugin reads nvidia.com/gpumemm; did you mean nvidia.com/gpumem?"
    outcome = PodOutcome(file="01.yaml", namespace="default", name="p", outcome="unschedulable", warnings=[warning])
    _print_outcome(outcome, _Printer(False, Path("/nowhere")))
    assert f"  Warning: {warning}" in capsys.readouterr().out


def test_hami_demo_without_examples_says_what_to_give(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = str(ROOT / "examples" / "demo-inventory.yaml")
    assert main(["demo", "--inventory", inventory, "--examples", str(tmp_path / "none")]) == 2
    assert "the examples folder" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------------
# The loopback API server
# --------------------------------------------------------------------------------------------------------


def test_the_api_server_wants_its_token_and_its_kubeconfig_carries_it(tmp_path: Path) -> None:
    with ClusterApiServer() as api:
        api.cluster.create("nodes", {"metadata": {"name": "n1"}})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{api.url}/api/v1/nodes", timeout=5)
        assert refused.value.code == 401
        path = api.write_kubeconfig(tmp_path / "kubeconfig")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        kube = KubeCluster.from_kubeconfig(str(path))
        try:
            nodes, _ = kube.list("nodes")
            kube.create("pods", {"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": []}})
        finally:
            kube.close()
    assert [n["metadata"]["name"] for n in nodes] == ["n1"]
    assert api.cluster.get("pods", "p", "default")["metadata"]["uid"]


def test_each_api_server_makes_its_own_token() -> None:
    first, second = ClusterApiServer(), ClusterApiServer()
    try:
        assert len(first.token) == 32
        assert first.token != second.token
    finally:
        first.stop()
        second.stop()


def test_a_pod_asking_no_served_device_is_not_taken_for_placed_on_a_one_node_world() -> None:
    from types import SimpleNamespace

    from hami.demo.journey import _asks_served_device

    world: Any = SimpleNamespace(nodes={"n1": SimpleNamespace(resources={"nvidia.com/gpu": "NVIDIA"})})

    def pod(resources: dict[str, Any]) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": "c", "resources": resources}]}}

    assert _asks_served_device(world, pod({"limits": {"nvidia.com/gpu": 1}}))
    assert not _asks_served_device(world, pod({"limts": {"nvidia.com/gpu": 1}}))  # a typo Kubernetes drops
    assert not _asks_served_device(world, pod({"limits": {"cpu": 1}}))
