"""An Iluvatar BI-V150 share through the real path, on a node of one BI-V150 board (two chips) in hami-core mode.

The node runs `hami node` with the Iluvatar plugin reading the Iluvatar package's own fake ixML
(vendors/iluvatar/tests/fake_ixml, a `libixml.so` answering NVML's documented calls from a machine file beside it),
exactly as it would read CoreX's: nothing about the GPUs is written for the daemon. The node registers the chips
under HAMi's `hami.io/node-BI-V150-register`; the pod's share is placed by the scheduler, served by Allocate with
Iluvatar's container edits and this project's isolation library `libvcorex.so` (its grant written on the host,
its accounting directory prepared), and cleaned up when the pod is deleted. A process of the container, run as
the container runs it (the installed libvcorex.so preloaded over the isolation tests' fake CoreX driver, with the
container's accounting file and the grant the daemon wrote), holds 8 MiB: the node's metrics report it for the pod.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_plane import ROOT, build_fake_library, wait_until
from hami_stack import DeviceNode, HamiStack

from hami.codec import decode_legacy_register, decode_pod_devices
from hami.isolation.grant import parse
from hami.plugins import VendorPlugins
from hami.testing.isolation_benchmark import load_setup
from hami.testing.sandbox import FAKE_STATE_SIZE, prepare

pytestmark = pytest.mark.e2e

FAKE_IXML = ROOT / "vendors" / "iluvatar" / "tests" / "fake_ixml" / "fake_ixml.c"
ISOLATION_TESTS = ROOT / "vendors" / "iluvatar" / "tests" / "isolation"
UUIDS = ["GPU-0e2f5a61-1150-4000-8000-000000000000", "GPU-0e2f5a61-1150-4000-8000-000000000001"]
COUNT, MEMORY, CORES = "iluvatar.ai/BI-V150-vgpu", "iluvatar.ai/BI-V150.vMem", "iluvatar.ai/BI-V150.vCore"


@pytest.fixture(scope="module")
def iluvatar_node(stack: HamiStack) -> Iterator[DeviceNode]:
    if "iluvatar" not in {v.name for v in VendorPlugins.load().vendors}:
        pytest.skip("the Iluvatar vendor plugin (hami-vendor-iluvatar) is not installed")
    if "iluvatar" in stack.disabled_vendors().split(","):
        pytest.skip("the chart rendered for this stack disables Iluvatar (vendors.iluvatar.enabled)")
    root = stack.dir / "nodes" / "iluvatar-node-1"
    ixml = build_fake_library(FAKE_IXML, root / "corex" / "libixml.so")
    # uuid minor memory-MiB bus-id board health name (fake_ixml.c's format): one board, two chips
    (ixml.parent / "fake_ixml.machine").write_text(
        "".join(f"{u} {i} 32768 00000000:{0x8A + i:02X}:00.0 0 ok Iluvatar BI-V150S\n" for i, u in enumerate(UUIDS))
    )
    settings = {"ixmlLibrary": str(ixml), "iluvatarMode": "hami-core", "sysfsRoot": str(root / "sys"),
                "hookPath": str(root / "vgpu-iluvatar")}  # fmt: skip
    node = DeviceNode(stack, "iluvatar-node-1", {"iluvatar": settings}, {}, {COUNT: None},
                      ("hami.io/node-BI-V150-register",))  # fmt: skip
    stack.add_node(node)
    yield node
    node.stop()
    del stack.nodes[node.name]
    stack.admin.delete("Node", node.name)
    shutil.rmtree(root, ignore_errors=True)


def node_metrics(node: DeviceNode) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def test_a_bi_v150_share_runs_with_iluvatars_edits_and_libvcorex(
    stack: HamiStack, iluvatar_node: DeviceNode, ns: str
) -> None:
    api = stack.admin
    registered = api.get("Node", iluvatar_node.name)["metadata"]["annotations"]["hami.io/node-BI-V150-register"]
    assert [(d.id, d.devmem, d.type) for d in decode_legacy_register(registered)] == [
        (u, 32768, "BI-V150") for u in UUIDS
    ]
    limits = {COUNT: "1", MEMORY: "16", CORES: "50"}
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "corex", "namespace": ns},
            "spec": {"containers": [{"name": "main", "image": "corex", "resources": {"limits": limits}}]},
        }
    )

    def running() -> dict[str, Any] | None:
        got = api.get("Pod", "corex", ns)
        return got if got["status"].get("phase") == "Running" else None

    got = wait_until(running, 60, "the Iluvatar pod Running", lambda: stack.describe_pod(ns, "corex"))
    assert got["spec"]["nodeName"] == iluvatar_node.name
    ((device,),) = decode_pod_devices(got["metadata"]["annotations"]["hami.io/BI-V150-devices-allocated"])
    assert device.uuid in UUIDS
    assert (device.usedmem, device.usedcores) == (4096, 50)  # 16 x 256 MiB
    env = {e["name"]: e.get("value") for e in got["spec"]["containers"][0].get("env", [])}
    assert env.get("SOL_CONTINER_NAME") == "main"  # HAMi's admission, for Iluvatar's gpu-manager

    served = iluvatar_node.kubelet.started[got["metadata"]["uid"]]
    edits = served.edits["main"][COUNT]
    minor = UUIDS.index(device.uuid)
    assert edits.env["IX_VISIBLE_DEVICES"] == device.uuid
    assert edits.env["ILUVATAR_COREX_VISIBLE_DEVICES"] == device.uuid
    assert (edits.env["IX_DEVICE_MEMORY_LIMIT_0"], edits.env["IX_DEVICE_SM_LIMIT_0"]) == ("4096m", "50")
    assert [d.host_path for d in edits.devices] == [f"/dev/iluvatar{minor}", "/dev/itrctl"]
    by_target = {m.container_path: m for m in edits.mounts}
    library = Path(by_target["/etc/ld.so.preload"].host_path).read_text().split()
    assert [Path(p).name for p in library] == ["libvcorex.so"]
    assert Path(library[0]).is_file()
    grant_dir = Path(by_target["/etc/hami/grant"].host_path)
    grant = parse((grant_dir / "iluvatar.grant").read_text())
    assert (grant.devices[0].memory_bytes, grant.devices[0].cores) == (4096 << 20, 50)
    accounting = Path(by_target["/hami-vcorex-shmem"].host_path)
    assert accounting.is_dir()

    text = node_metrics(iluvatar_node)
    limit = re.search(r'^hami_vgpu_memory_limit_bytes\{[^}]*pod="corex"[^}]*\} (\S+)$', text, re.MULTILINE)
    assert limit is not None, text
    assert float(limit.group(1)) == 4096 << 20
    assert f'device_uuid="{UUIDS[0]}"' in text

    # a process of the container holds 8 MiB: its usage reaches the node's metrics through the accounting file
    build_dir = iluvatar_node.dir / "isolation-build"
    build_dir.mkdir(exist_ok=True)
    build = prepare(load_setup(ISOLATION_TESTS / "conftest.py"), build_dir)
    fake_state = build_dir / "fake.state"
    fake_state.write_bytes(bytes(FAKE_STATE_SIZE))
    process_env = {**edits.env, "IX_DEVICE_MEMORY_SHARED_CACHE": str(accounting / "vcorex.cache"),
                   "HAMI_ISOLATION_GRANT_DIR": str(grant_dir), "LD_PRELOAD": str(library[0]),
                   "LD_LIBRARY_PATH": str(build_dir), "FAKE_CUDA_STATE": str(fake_state)}  # fmt: skip
    holder = subprocess.Popen([str(build.client), "hold", str(8 << 20), "1"], env=process_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held", holder.stderr.read() if holder.stderr else ""

        def used() -> float | None:
            found = re.search(r'^hami_vgpu_memory_used_bytes\{[^}]*pod="corex"[^}]*\} (\S+)$', node_metrics(
                iluvatar_node), re.MULTILINE)  # fmt: skip
            return float(found.group(1)) if found and float(found.group(1)) > 0 else None

        assert wait_until(used, 30, "the held memory in the node's metrics", stack.diagnose) == 8 << 20
    finally:
        holder.kill()
        holder.wait()

    api.delete("Pod", "corex", ns)
    wait_until(lambda: (not accounting.exists() and not grant_dir.exists()) or None, 60,
               "the accounting and grant directories removed after the pod was deleted",
               lambda: stack.describe_pod(ns, "corex"))  # fmt: skip
