"""Signed placements in the scheduler: a tenant's edits of its own pod's annotations never shrink its usage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from scheduler_harness import Harness, gpu_node, gpu_pod

from hami.cluster import meta
from hami.signing import SIGNATURE_ANNOTATION, PlacementKeys

ALLOCATED = "hami.io/vgpu-devices-allocated"


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PlacementKeys:
    (tmp_path / "current").write_bytes(b"s" * 32)
    monkeypatch.setenv("HAMI_PLACEMENT_KEYS", str(tmp_path))
    return PlacementKeys.from_directory(tmp_path)


@pytest.fixture
def signed(keys: PlacementKeys) -> Iterator[Harness]:
    h = Harness()
    h.add_node(gpu_node("n1", gpus=1, memory=16384))
    h.start()
    yield h
    h.stop()


def _used(h: Harness) -> int:
    assert h.service is not None
    return h.service.state.usage_snapshot()["n1"]["NVIDIA"]["GPU-n1-0"][1]


def _mismatches(h: Harness) -> float:
    assert h.service is not None
    value = h.service.metrics.registry.get_sample_value("hami_scheduler_placement_mismatches_total")
    return value or 0.0


def _shrink(h: Harness, name: str, *, drop_signature: bool = False) -> None:
    """What the tenant does: rewrite its running pod's allocated annotation to claim 1 MiB of the GPU."""
    annotations = meta(h.cluster.get("pods", name, "default"))["annotations"]
    forged: dict[str, str | None] = {ALLOCATED: annotations[ALLOCATED].replace(",15000,", ",1,")}
    if drop_signature:
        forged[SIGNATURE_ANNOTATION] = None
    h.cluster.patch_metadata("pods", name, "default", annotations=forged)
    h.flush()


def test_the_scheduler_signs_each_placement_it_writes(signed: Harness, keys: PlacementKeys) -> None:
    signed.add_pod(gpu_pod("a", mem=15000))
    assert signed.schedule("a") == "n1"
    pod = signed.cluster.get("pods", "a", "default")
    placement = keys.verify(meta(pod)["annotations"], meta(pod)["uid"], "n1")
    assert placement.annotations[ALLOCATED] == meta(pod)["annotations"][ALLOCATED]


def test_rewriting_the_allocated_annotation_does_not_free_the_gpu(signed: Harness) -> None:
    """The tenant shrinks its running pod's allocated memory so that the next pod lands on the same GPU."""
    signed.add_pod(gpu_pod("a", mem=15000))
    assert signed.schedule("a") == "n1"
    signed.flush()
    _shrink(signed, "a")
    assert _used(signed) == 15000
    signed.add_pod(gpu_pod("b", mem=8000))
    assert signed.filter("b")["NodeNames"] == []
    events = [e for e in signed.cluster.events if e["reason"] == "PlacementSignatureMismatch"]
    assert [e["involvedObject"]["name"] for e in events] == ["a"]
    assert ALLOCATED in events[0]["message"]
    assert events[0]["type"] == "Warning"
    assert _mismatches(signed) == 1
    signed.restart()  # a restarted scheduler reads the signed values, not the rewritten ones
    assert _used(signed) == 15000
    assert signed.filter("b")["NodeNames"] == []


def test_removing_the_signature_keeps_the_decided_usage(signed: Harness) -> None:
    """The tenant removes the signature as well, hoping the scheduler then trusts its rewritten annotation."""
    signed.add_pod(gpu_pod("a", mem=15000))
    assert signed.schedule("a") == "n1"
    signed.flush()
    _shrink(signed, "a", drop_signature=True)
    assert _used(signed) == 15000
    assert _mismatches(signed) == 1
    events = [e["message"] for e in signed.cluster.events if e["reason"] == "PlacementSignatureMismatch"]
    assert "keeping the usage the scheduler decided" in events[0]


def test_a_signature_copied_from_another_pod_counts_nothing_extra_and_is_reported(signed: Harness) -> None:
    """The tenant copies a neighbour's signature onto its own pod: it verifies for the neighbour's UID only."""
    signed.add_pod(gpu_pod("a", mem=4000))
    assert signed.schedule("a") == "n1"
    signed.flush()
    stolen = meta(signed.cluster.get("pods", "a", "default"))["annotations"][SIGNATURE_ANNOTATION]
    forged = gpu_pod("c", mem=4000, annotations={SIGNATURE_ANNOTATION: stolen, "hami.io/vgpu-node": "n1"})
    signed.add_pod(forged)
    signed.flush()
    assert _mismatches(signed) == 1
    message = next(e["message"] for e in signed.cluster.events if e["reason"] == "PlacementSignatureMismatch")
    assert "was made for the pod with UID" in message


def test_without_keys_the_annotations_count_as_they_stand(harness: Harness) -> None:
    """HAMi's behaviour, kept when no key is configured: the tenant's edit is believed (and logged at start)."""
    harness.add_node(gpu_node("n1", gpus=1, memory=16384))
    harness.start()
    harness.add_pod(gpu_pod("a", mem=15000))
    assert harness.schedule("a") == "n1"
    assert SIGNATURE_ANNOTATION not in meta(harness.cluster.get("pods", "a", "default"))["annotations"]
    harness.flush()
    _shrink(harness, "a")
    assert _used(harness) == 1
