"""The vDCU rules on their own: CU masks never overlap and are HAMi's written form, directory names round-trip."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hami_vendor_hygon.vdcu import VdevEntry, allocate_mask, cu_count, format_conf, mask_text


def test_cu_count_is_hamis_rounding() -> None:
    assert [cu_count(p, 60) for p in (0, 1, 50, 99, 100)] == [1, 1, 30, 59, 60]
    assert cu_count(33, 120) == 39


@given(st.lists(st.integers(1, 128), max_size=12), st.integers(1, 128))
def test_masks_never_overlap_and_stay_on_the_device(requests: list[int], compute_units: int) -> None:
    used = 0
    for count in requests:
        mask = allocate_mask(used, compute_units, count)
        free = compute_units - bin(used).count("1")
        if count > free:
            assert mask == 0
            continue
        assert bin(mask).count("1") == count
        assert mask & used == 0
        assert mask >> compute_units == 0
        used |= mask


@given(
    st.from_regex(r"[a-z0-9-]{1,36}", fullmatch=True),
    st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True),
    st.integers(0, 15),
    st.integers(0, 3),
    st.integers(0, 63),
    st.integers(0, 2**128 - 1),
)
def test_directory_names_round_trip(uid: str, container: str, device: int, pipe: int, vdev: int, mask: int) -> None:
    entry = VdevEntry(uid, container, device, pipe, vdev, mask)
    assert VdevEntry.parse(entry.name) == entry


@given(st.text(max_size=80))
def test_any_directory_name_parses_or_is_ignored(name: str) -> None:
    entry = VdevEntry.parse(name)
    assert entry is None or entry.name.split("_")[:2] == name.split("_")[:2]


def test_the_file_body_is_hamis() -> None:
    assert mask_text(0x3F) == "000000000000003f"
    body = format_conf("0000:10:00.0", (1 << 64) | 0x3, 3, 2048, 1, 7, 2)
    assert body.splitlines() == [
        "PciBusId: 0000:10:00.0",
        "cu_mask: 0x0000000000000003",
        "cu_mask: 0x0000000000000001",
        "cu_count: 3",
        "mem: 2048 MiB",
        "device_id: 1",
        "vdev_id: 7",
        "pipe_id: 2",
        "enable: 1",
    ]
