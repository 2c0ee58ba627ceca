"""A Biren card through the real path, on a node of two cards read through the Biren package's fake BRML.

The node runs `hami node` with the Biren plugin reading vendors/biren/tests/fake_brml (a `libbiren-ml.so` answering
brml.h's calls from a machine file), exactly as it would read the real library. The node registers the cards as
HAMi's Biren device plugin does (`hami.io/node-biren-register`, `card_<id>`), the scheduler places the pod with
HAMi's `hami.io/Biren-devices-*` annotations, and Allocate answers with Biren's container edits.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from control_plane import ROOT, build_fake_library, wait_until
from hami_stack import DeviceNode, HamiStack

from hami.codec import decode_pod_devices
from hami.plugins import VendorPlugins

pytestmark = pytest.mark.e2e

FAKE_BRML = ROOT / "vendors" / "biren" / "tests" / "fake_brml" / "fake_brml.c"


@pytest.fixture(scope="module")
def biren_node(stack: HamiStack) -> Iterator[DeviceNode]:
    if "biren" not in {v.name for v in VendorPlugins.load().vendors}:
        pytest.skip("the Biren vendor plugin (hami-vendor-biren) is not installed")
    root = stack.dir / "nodes" / "biren-node-1"
    library = build_fake_library(FAKE_BRML, root / "brml" / "libbiren-ml.so")
    machine = root / "brml.machine"
    machine.write_text("BR-0a1b BR104 32768 4\nBR-0a1c BR104 32768 5\n")  # uuid name memory-MiB node-id
    node = DeviceNode(
        stack,
        "biren-node-1",
        {"biren": {"brmlLibrary": str(library)}},
        {"FAKE_BRML_CONFIG": str(machine)},
        {"birentech.com/gpu": "2"},
        ("hami.io/node-biren-register", "hami.io/node-handshake-biren"),
    )
    stack.add_node(node)
    yield node
    node.stop()
    del stack.nodes[node.name]
    stack.admin.delete("Node", node.name)


def test_a_biren_card_runs_with_hamis_annotations_and_birens_edits(
    stack: HamiStack, biren_node: DeviceNode, ns: str
) -> None:
    stack.admin.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "card", "namespace": ns},
            "spec": {
                "containers": [{"name": "supa", "image": "supa", "resources": {"limits": {"birentech.com/gpu": "1"}}}]
            },
        }
    )

    def running() -> dict[str, Any] | None:
        got = stack.admin.get("Pod", "card", ns)
        return got if got["status"].get("phase") == "Running" else None

    got = wait_until(running, 60, "the Biren pod Running", stack.diagnose)
    assert got["spec"]["nodeName"] == biren_node.name
    annotations = got["metadata"]["annotations"]
    ((device,),) = decode_pod_devices(annotations["hami.io/Biren-devices-allocated"])
    assert (device.uuid, device.type, device.usedmem, device.usedcores) == ("card_5", "Biren", 0, 0)
    assert annotations["hami.io/Biren-devices-to-allocate"] in ("", ";")  # served: the node side emptied it
    edits = biren_node.kubelet.started[got["metadata"]["uid"]].edits["supa"]["birentech.com/gpu"]
    assert dict(edits.env) == {"BR_PHY_CARDS": "card_5"}
    assert [d.host_path for d in edits.devices] == ["/dev/biren/card_5"]
    stack.admin.delete("Pod", "card", ns)
