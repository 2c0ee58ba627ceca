"""Fixtures of the end-to-end suite: a real etcd + kube-apiserver + kube-scheduler, with HAMi on top.

One cluster serves the whole session (starting it takes about half a minute): the chart applied, `hami
scheduler` (extender and webhook) and kube-scheduler running as the chart configures them, and two GPU nodes,
each with its kubelet and `hami node` over NVIDIA's fake NVML (2 × 16 GiB GPUs, split 10). Every test works in
a namespace of its own, and its pods are removed when it ends, so the next test finds the devices free.

The binaries come from `tests/e2e/build_control_plane.sh`; without them the tests skip and say so, unless
HAMI_E2E_REQUIRED=1 (CI), where a missing binary is a failure.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from control_plane import Binaries, ControlPlane, MissingBinaries, find_binaries, not_built, wait_until
from hami_stack import HamiStack, build_fake_nvml, gpu_box
from kube_rest import ApiError, KubeApi

GPU_NODES = {"gpu-node-1": "a1", "gpu-node-2": "b2"}
"""The session's GPU nodes and the tag of their GPUs' UUIDs."""


@pytest.fixture(scope="session")
def binaries() -> Binaries:
    try:
        return find_binaries()
    except MissingBinaries as exc:
        not_built(exc)


E2E_DIR = Path(__file__).resolve().parent
_running: list[HamiStack] = []


@pytest.fixture(scope="session")
def stack(binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HamiStack]:
    work = tmp_path_factory.mktemp("e2e")
    plane = ControlPlane(binaries, work / "cluster").start()
    hami = HamiStack(plane, binaries, work / "hami")
    _running.append(hami)
    try:
        hami.start()
        library = build_fake_nvml(work / "fake-nvml")
        for name, tag in GPU_NODES.items():
            hami.add_gpu_node(name, gpu_box(tag, 2), library)
        yield hami
    except BaseException:
        print(hami.diagnose())
        raise
    finally:
        _stop_stack()


def _stop_stack() -> None:
    while _running:
        _running.pop().stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Stop the cluster as soon as the last end-to-end test is done, not at the end of the whole session: its
    processes would otherwise idle beside the rest of the suite (and its timing-sensitive isolation tests)."""
    result = yield
    if _running and (nextitem is None or E2E_DIR not in nextitem.path.parents):
        _stop_stack()
    return result


@pytest.fixture(scope="session")
def api(stack: HamiStack) -> KubeApi:
    return stack.admin


_counter = itertools.count()


@pytest.fixture
def ns(stack: HamiStack, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for the test; its pods are force-deleted afterwards and waited for."""
    name = f"e2e-{next(_counter)}-{request.node.name.removeprefix('test_').replace('_', '-')}"[:63].rstrip("-")
    stack.admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    for kubelet in (n.kubelet for n in stack.nodes.values()):
        kubelet.resume()
    pods = stack.admin.list("Pod", name).get("items") or []
    for pod in pods:
        try:
            stack.admin.delete("Pod", pod["metadata"]["name"], name, grace=0)
        except ApiError as exc:
            if exc.status != 404:
                raise
    wait_until(lambda: not stack.admin.list("Pod", name).get("items"), 60, f"pods of {name} gone")
    wait_until(  # the pods' series; the namespace's quota series (hami_resource_quota_*) stay with its ResourceQuota
        lambda: (
            not any(
                f'namespace="{name}"' in line and not line.startswith("hami_resource_quota")
                for line in stack.scheduler_metrics().splitlines()
            )
        ),
        30,
        f"the scheduler forgot the pods of {name}",
    )


@pytest.fixture(scope="session")
def chart_dir() -> Path:
    return Path(__file__).resolve().parent.parent.parent / "charts" / "hami"
