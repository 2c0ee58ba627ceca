"""Golden files: the annotations this project writes for a decision, byte for byte what HAMi v2.10 writes for
the same decision (`golden/*.json`; times, which differ per run, are checked for their form and masked).

Each case is a pod through the real extender (filter, then bind) on the in-memory cluster; the golden file
holds, per case, the pod's annotations and the node's lock after bind (none for a pod of kinds HAMi's node side
does not serve, for which HAMi takes no lock). HAMi's forms, from its source at
v2.10.0: `…-devices-to-allocate` and `…-devices-allocated` are `EncodePodSingleDevice` (one `;`-terminated
entry per container, init containers first, an empty entry for a container without devices, each device
`uuid,type,mem,cores:`); `hami.io/vgpu-node` and `hami.io/vgpu-time` (unix seconds) at filter;
`hami.io/bind-phase: allocating` and `hami.io/bind-time` at bind; the node lock `<RFC3339>,<ns>,<name>`
(`nodelock.GenerateNodeLockKeyByPod`); Ascend's `huawei.com/<chip>` runtime list (`RuntimeInfo`: UUID, temp,
memory, core, zero values left out) and `predicate-time`. AMD's device strings carry the GPU's model as the type and
its compute units as the cores (``floor(percent × CUs / 100)``; a container without cores or memory, the whole GPU),
as HAMi's ``AMDDevices.Fit`` writes them. Kunlunxin's vXPU memory is rounded up to a P800 partition (20000 MiB is a
quarter, 24576, and 25 cores), and its XPUs are chosen by position in HAMi's sorted list (``graghSelect``); whole
Kunlunxin XPUs come from the node's capacity and add ``BAIDU_COM_DEVICE_IDX`` (and, beyond HAMi's
``hami.io/kunlun-allocated``, this scheduler's own ``hami.io/kunlun-devices-to-allocate``). Vastai's placements ask
no memory or cores (``,0,0``), and several dies come from the card with most of them free.

Set HAMI_UPDATE_GOLDEN=1 to rewrite the files from what the code writes (then review the diff).
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from scheduler_harness import Harness, gpu_node
from vendor_nodes import ascend_node, vendor_node

from hami.cluster import meta
from hami.codec import (
    decode_node_lock,
    decode_pod_devices,
    encode_node_register,
    encode_pod_devices,
)
from hami.model import Device

GOLDEN = Path(__file__).parent / "golden"
UNIX_KEYS = ("hami.io/vgpu-time", "hami.io/bind-time", "predicate-time")
NANO_KEYS = ("mthreads.com/predicate-time", "enflame.com/gcu-assigned-time", "NEURON_ALLOC_TIME")
LOCK = "hami.io/mutex.lock"


def container(name: str, limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": limits}} if limits else {"name": name}


def sidecar(name: str, limits: dict[str, str]) -> dict[str, Any]:
    """A native sidecar: an init container with `restartPolicy: Always` (Kubernetes 1.29 and later)."""
    return {**container(name, limits), "restartPolicy": "Always"}


def pod(
    name: str, apps: list[dict[str, Any]], init: list[dict[str, Any]] | None = None, **annotations: str
) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "hami-scheduler", "containers": apps}
    if init:
        spec["initContainers"] = init
    return {
        "metadata": {"name": name, "namespace": "default", "annotations": dict(annotations)},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def amd_node(name: str) -> dict[str, Any]:
    """Two MI300X as HAMi's AMD device plugin registers them: JSON, devcore = the compute units, type = the model."""
    devices = [
        Device(id=f"{name}-{i}", index=i, count=10, devmem=196608, devcore=304, type="AMD Instinct MI300X", numa=0)
        for i in range(2)
    ]
    return {
        "metadata": {"name": name, "annotations": {"hami.io/node-amd-register": encode_node_register(devices)}},
        "status": {"capacity": {"amd.com/gpu": "20"}},
    }


def vastai_node(name: str) -> dict[str, Any]:
    """Four dies as Vastai's plugin registers them (JSON, custominfo): three on card 0, one on card 1, no cores."""
    devices = [
        Device(id=f"{name}-{i}", index=i, count=4, devmem=16384, devcore=0, type="Vastai", numa=0,
               custom={"DeviceStrategy": "die", "AIC": "0" if i < 3 else "1"})
        for i in range(4)
    ]  # fmt: skip
    return {
        "metadata": {"name": name, "annotations": {"hami.io/node-va-register": encode_node_register(devices)}},
        "status": {"capacity": {"vastaitech.com/va": "16"}},
    }


GPU = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}
CASES: dict[str, tuple[dict[str, Any], Any]] = {
    "nvidia-one-container": (pod("p", [container("cuda", GPU)]), gpu_node("node-a", gpus=2)),
    "nvidia-init-and-sidecar-without-devices": (
        pod("p", [container("cuda", GPU), container("sidecar")], init=[container("setup")]),
        gpu_node("node-a", gpus=2),
    ),
    "nvidia-two-gpus-in-one-container": (
        pod("p", [container("cuda", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4000"})]),
        gpu_node("node-a", gpus=2),
    ),
    "ascend-template-and-whole-card": (
        pod(
            "p",
            [
                container("share", {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "8000"}),
                container("whole", {"huawei.com/Ascend910B3": "1"}),
            ],
        ),
        ascend_node("npu-a"),
    ),
    "hygon-share-and-whole-card": (
        pod(
            "p",
            [
                container("share", {"hygon.com/dcunum": "1", "hygon.com/dcumem": "2000", "hygon.com/dcucores": "30"}),
                container("whole", {"hygon.com/dcunum": "1", "hygon.com/dcucores": "100"}),
            ],
        ),
        vendor_node("dcu-a", "hami.io/node-dcu-register", "hygon.com/dcunum", "DCU", prefix="DCU-", legacy=True),
    ),
    "iluvatar-two-chips-and-a-sidecar": (
        pod(
            "p",
            [
                container("main", {"iluvatar.ai/BI-V150-vgpu": "2", "iluvatar.ai/BI-V150.vMem": "4"}),
                container("sidecar"),
            ],
        ),
        vendor_node("ix-a", "hami.io/node-BI-V150-register", "iluvatar.ai/BI-V150-vgpu", "BI-V150", legacy=True),
    ),
    "mthreads-share": (
        pod("p", [container("main", {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "4"})]),
        vendor_node("mt-a", "hami.io/node-mthreads-register", "mthreads.com/vgpu", "MTT S4000"),
    ),
    "cambricon-share": (
        pod(
            "p",
            [
                container(
                    "main",
                    {
                        "cambricon.com/vmlu": "1",
                        "cambricon.com/mlu.smlu.vmemory": "16",
                        "cambricon.com/mlu.smlu.vcore": "25",
                    },
                )
            ],
        ),
        vendor_node("mlu-a", "hami.io/node-cambricon-mlu-register", "cambricon.com/vmlu", "MLU370-X8"),
    ),
    "amd-share-and-whole-card": (
        pod(
            "p",
            [
                container("share", {"amd.com/gpu": "1", "amd.com/gpumem": "16384", "amd.com/gpucores": "25"}),
                container("whole", {"amd.com/gpu": "1"}),
            ],
        ),
        amd_node("amd-a"),
    ),
    "kunlun-vxpu-quarter-and-two-whole": (
        pod(
            "p",
            [
                container("quarter", {"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "20000"}),
                container("pair", {"kunlunxin.com/vxpu": "2"}),
            ],
        ),
        vendor_node("p800-a", "hami.io/node-register-xpu", "kunlunxin.com/vxpu", "XPU", count=8, memory=98304),
    ),
    "kunlun-two-whole-xpus": (
        pod("p", [container("main", {"kunlunxin.com/xpu": "2"})]),
        {"metadata": {"name": "p800-b", "annotations": {}}, "status": {"capacity": {"kunlunxin.com/xpu": "8"}}},
    ),
    "vastai-two-dies-of-one-card": (
        pod("p", [container("main", {"vastaitech.com/va": "2"})]),
        vastai_node("va-a"),
    ),
    "metax-whole-cards": (
        pod("p", [container("main", {"metax-tech.com/gpu": "2"})], init=[container("setup")]),
        vendor_node("mx-a", "hami.io/node-metax-gpu-register", "metax-tech.com/gpu", "MXC500", count=3, split=1),
    ),
    "enflame-whole-cards": (
        pod("p", [container("main", {"enflame.com/gcu": "2"})], init=[container("setup")]),
        {"metadata": {"name": "gcu-a"}, "status": {"capacity": {"enflame.com/gcu": "3"}}},
    ),
    "enflame-drs-profiles": (
        pod(
            "p",
            [
                container("by-size", {"enflame.com/drs-gcu": "3"}),
                container("by-spec", {"enflame.com/gcu-memory": "20480", "enflame.com/gcu-core": "40"}),
            ],
        ),
        {
            "metadata": {
                "name": "drs-a",
                "annotations": {
                    "enflame.com/gcu-drs-capacity": '{"devices":[{"index":"0","minor":"0","capacity":6},'
                    '{"index":"1","minor":"1","capacity":6}],"profiles":{"1g.6gb":"0","3g.20gb":"1","6g.40gb":"2"}}'
                },
            },
            "status": {"capacity": {"enflame.com/drs-gcu": "12"}},
        },
    ),
    "awsneuron-cores-and-a-device": (
        pod(
            "p",
            [
                container("cores", {"aws.amazon.com/neuroncore": "1"}),
                container("device", {"aws.amazon.com/neuron": "1"}),
            ],
        ),
        {
            "metadata": {"name": "inf-a", "labels": {"node.kubernetes.io/instance-type": "inf2.xlarge"}},
            "status": {"capacity": {"aws.amazon.com/neuron": "2", "aws.amazon.com/neuroncore": "4"}},
        },
    ),
    "biren-two-cards": (
        pod("p", [container("main", {"birentech.com/gpu": "2"})], init=[container("setup")]),
        vendor_node("br-a", "hami.io/node-biren-register", "birentech.com/gpu", "Biren", count=3, split=1),
    ),
}

# Native sidecars (HAMi PR #2723, after v2.10): the sidecar's entry sits at its own position among the init
# containers, as HAMi writes its init containers' entries, and is placed beside the app containers' (never on a share
# they need at the same time).
HYGON = {"hygon.com/dcunum": "1", "hygon.com/dcumem": "2000", "hygon.com/dcucores": "30"}
ILUVATAR = {"iluvatar.ai/BI-V150-vgpu": "1", "iluvatar.ai/BI-V150.vMem": "4"}
MTHREADS = {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "4"}
CAMBRICON = {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "16", "cambricon.com/mlu.smlu.vcore": "25"}
AMD = {"amd.com/gpu": "1", "amd.com/gpumem": "16384", "amd.com/gpucores": "25"}
KUNLUN = {"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "20000"}
ASCEND = {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "8000"}
SIDECAR_CASES: dict[str, tuple[dict[str, Any], Any]] = {
    "nvidia-native-sidecar": (
        pod("p", [container("cuda", GPU)], init=[container("setup"), sidecar("proxy", GPU)]),
        gpu_node("node-a", gpus=2),
    ),
    "ascend-native-sidecar": (
        pod("p", [container("share", ASCEND)], init=[sidecar("proxy", ASCEND)]),
        ascend_node("npu-a"),
    ),
    "hygon-native-sidecar": (
        pod("p", [container("share", HYGON)], init=[sidecar("proxy", HYGON)]),
        vendor_node("dcu-a", "hami.io/node-dcu-register", "hygon.com/dcunum", "DCU", prefix="DCU-", legacy=True),
    ),
    "iluvatar-native-sidecar": (
        pod("p", [container("main", ILUVATAR)], init=[sidecar("proxy", ILUVATAR)]),
        vendor_node("ix-a", "hami.io/node-BI-V150-register", "iluvatar.ai/BI-V150-vgpu", "BI-V150", legacy=True),
    ),
    "mthreads-native-sidecar": (
        pod("p", [container("main", MTHREADS)], init=[sidecar("proxy", MTHREADS)]),
        vendor_node("mt-a", "hami.io/node-mthreads-register", "mthreads.com/vgpu", "MTT S4000"),
    ),
    "cambricon-native-sidecar": (
        # a dynamic-sMLU share must be a pod's only MLU request (HAMi's rule): whole MLUs here
        pod(
            "p", [container("main", {"cambricon.com/vmlu": "1"})], init=[sidecar("proxy", {"cambricon.com/vmlu": "1"})]
        ),
        vendor_node("mlu-a", "hami.io/node-cambricon-mlu-register", "cambricon.com/vmlu", "MLU370-X8"),
    ),
    "amd-native-sidecar": (
        pod("p", [container("share", AMD)], init=[sidecar("proxy", AMD)]),
        amd_node("amd-a"),
    ),
    "kunlun-native-sidecar": (
        pod("p", [container("quarter", KUNLUN)], init=[sidecar("proxy", KUNLUN)]),
        vendor_node("p800-a", "hami.io/node-register-xpu", "kunlunxin.com/vxpu", "XPU", count=8, memory=98304),
    ),
    "vastai-native-sidecar": (
        pod("p", [container("main", {"vastaitech.com/va": "1"})], init=[sidecar("proxy", {"vastaitech.com/va": "1"})]),
        vastai_node("va-a"),
    ),
    "metax-native-sidecar": (
        pod(
            "p",
            [container("main", {"metax-tech.com/gpu": "2"})],
            init=[sidecar("proxy", {"metax-tech.com/gpu": "1"})],
        ),
        vendor_node("mx-a", "hami.io/node-metax-gpu-register", "metax-tech.com/gpu", "MXC500", count=3, split=1),
    ),
    "enflame-native-sidecar": (
        pod("p", [container("main", {"enflame.com/gcu": "2"})], init=[sidecar("proxy", {"enflame.com/gcu": "1"})]),
        {"metadata": {"name": "gcu-a"}, "status": {"capacity": {"enflame.com/gcu": "3"}}},
    ),
    "awsneuron-native-sidecar": (
        pod(
            "p",
            [container("device", {"aws.amazon.com/neuron": "1"})],
            init=[sidecar("proxy", {"aws.amazon.com/neuroncore": "1"})],
        ),
        {
            "metadata": {"name": "inf-a", "labels": {"node.kubernetes.io/instance-type": "inf2.xlarge"}},
            "status": {"capacity": {"aws.amazon.com/neuron": "2", "aws.amazon.com/neuroncore": "4"}},
        },
    ),
    "biren-native-sidecar": (
        pod("p", [container("main", {"birentech.com/gpu": "2"})], init=[sidecar("proxy", {"birentech.com/gpu": "1"})]),
        vendor_node("br-a", "hami.io/node-biren-register", "birentech.com/gpu", "Biren", count=3, split=1),
    ),
}
CASES.update(SIDECAR_CASES)


def masked(annotations: dict[str, str]) -> dict[str, str]:
    out = {}
    for key, value in sorted(annotations.items()):
        if key in UNIX_KEYS:
            assert re.fullmatch(r"[0-9]+", value), (key, value)
            assert abs(int(value) - time.time()) < 300, (key, value)
            value = "<unix seconds>"
        if key in NANO_KEYS:
            assert re.fullmatch(r"[0-9]+", value), (key, value)
            assert abs(int(value) / 1e9 - time.time()) < 300, (key, value)
            value = "<unix nanoseconds>"
        out[key] = value
    return out


def decided(harness: Harness, name: str) -> dict[str, Any]:
    """Filter and bind the case's pod; its annotations and the node's lock, times masked."""
    answer = harness.filter("p")
    assert len(answer["NodeNames"]) == 1, answer
    (node,) = answer["NodeNames"]
    lock_before_bind = meta(harness.cluster.get("nodes", node)).get("annotations", {}).get(LOCK)
    assert lock_before_bind is None
    assert harness.bind("p", node) == {"Error": ""}
    annotations = dict(meta(harness.cluster.get("pods", "p", "default")).get("annotations") or {})
    raw = (meta(harness.cluster.get("nodes", node)).get("annotations") or {}).get(LOCK)
    if raw is None:  # HAMi takes no node lock for kinds its node side does not serve (Enflame DRS, AWS Neuron)
        return {"node": node, "pod annotations": masked(annotations), "node lock": None}
    lock = str(raw)
    when, _, owner = lock.partition(",")
    parsed = datetime.fromisoformat(when.replace("Z", "+00:00"))
    assert parsed.tzinfo is not None
    assert abs(parsed.timestamp() - time.time()) < 300
    decode_node_lock(lock)
    return {"node": node, "pod annotations": masked(annotations), "node lock": f"<RFC3339>,{owner}"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_annotations_match_the_golden_file(harness: Harness, case: str) -> None:
    the_pod, the_node = CASES[case]
    harness.add_node(the_node)
    harness.add_pod(the_pod)
    harness.start()
    got = decided(harness, case)
    path = GOLDEN / f"{case}.json"
    if os.environ.get("HAMI_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text()), f"{path.name} differs; HAMI_UPDATE_GOLDEN=1 rewrites it"
    # what the node side reads back is exactly what was written
    for key, value in got["pod annotations"].items():
        if key.endswith("-devices-allocated") or key.endswith("-devices-to-allocate"):
            assert encode_pod_devices(decode_pod_devices(value)) == value
