"""Signed placements (`hami.signing`): what a tenant who can patch its own pod tries against the signature."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.errors import ConfigError
from hami.signing import SIGNATURE_ANNOTATION, PlacementKeys, SignatureError, SignedPlacement, changed

KEY = b"k" * 32
PLACEMENT = SignedPlacement(
    "uid-1", "gpu-node", {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,3000,0:;", "hami.io/extra": ""}
)


def test_a_signature_gives_back_the_signed_placement() -> None:
    keys = PlacementKeys(KEY)
    value = keys.sign(PLACEMENT)
    assert keys.verify({SIGNATURE_ANNOTATION: value}, "uid-1", "gpu-node") == PLACEMENT


def test_a_signature_copied_onto_another_pod_or_node_is_refused() -> None:
    """The tenant copies a real pod's signature onto its own pod, or claims the placement on another node."""
    keys = PlacementKeys(KEY)
    annotations = {SIGNATURE_ANNOTATION: keys.sign(PLACEMENT)}
    with pytest.raises(SignatureError, match="UID uid-1"):
        keys.verify(annotations, "uid-2", "gpu-node")
    with pytest.raises(SignatureError, match="node gpu-node, not on other"):
        keys.verify(annotations, "uid-1", "other")


def test_a_signature_made_with_a_guessed_key_is_refused() -> None:
    """The tenant signs its own placement with a key of its choosing."""
    forged = PlacementKeys(b"t" * 32).sign(PLACEMENT)
    with pytest.raises(SignatureError, match="does not verify"):
        PlacementKeys(KEY).verify({SIGNATURE_ANNOTATION: forged}, "uid-1", "gpu-node")


@given(position=st.integers(min_value=0), replacement=st.characters(codec="ascii"))
def test_any_edit_of_the_signature_value_is_refused(position: int, replacement: str) -> None:
    """The tenant edits one character of the signature, e.g. the payload's memory figure."""
    keys = PlacementKeys(KEY)
    value = keys.sign(PLACEMENT)
    at = position % len(value)
    edited = value[:at] + replacement + value[at + 1 :]
    if edited == value:
        return
    with pytest.raises(SignatureError):
        keys.verify({SIGNATURE_ANNOTATION: edited}, "uid-1", "gpu-node")


@given(st.text(max_size=200))
def test_garbage_in_the_signature_is_refused_clearly(value: str) -> None:
    """The tenant writes anything at all into the signature annotation."""
    with pytest.raises(SignatureError, match=SIGNATURE_ANNOTATION + "|no "):
        PlacementKeys(KEY).verify({SIGNATURE_ANNOTATION: value}, "uid-1", "gpu-node")


def test_rotation_accepts_the_previous_key_and_signs_with_the_new(tmp_path: Path) -> None:
    old = PlacementKeys(b"o" * 32).sign(PLACEMENT)
    (tmp_path / "current").write_bytes(KEY + b"\n")
    (tmp_path / "previous").write_bytes(b"o" * 32)
    rotated = PlacementKeys.from_directory(tmp_path)
    assert rotated.verify({SIGNATURE_ANNOTATION: old}, "uid-1", "gpu-node") == PLACEMENT
    assert PlacementKeys(KEY).verify({SIGNATURE_ANNOTATION: rotated.sign(PLACEMENT)}, "uid-1", "gpu-node")
    (tmp_path / "previous").unlink()
    with pytest.raises(SignatureError):
        PlacementKeys.from_directory(tmp_path).verify({SIGNATURE_ANNOTATION: old}, "uid-1", "gpu-node")


def test_keys_come_from_the_environment_or_not_at_all(tmp_path: Path) -> None:
    assert PlacementKeys.from_environment({}) is None
    with pytest.raises(ConfigError, match="cannot read the placement signing key"):
        PlacementKeys.from_environment({"HAMI_PLACEMENT_KEYS": str(tmp_path)})
    (tmp_path / "current").write_bytes(b"short")
    with pytest.raises(ConfigError, match="at least 16"):
        PlacementKeys.from_environment({"HAMI_PLACEMENT_KEYS": str(tmp_path)})


def test_changed_names_the_annotations_edited_since_signing() -> None:
    edited = {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,1,0:;", "hami.io/extra": ""}
    assert changed(edited, PLACEMENT) == ["hami.io/vgpu-devices-allocated"]
    assert changed(dict(PLACEMENT.annotations), PLACEMENT) == []
