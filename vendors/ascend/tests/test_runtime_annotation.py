"""Ascend's runtime annotation ``huawei.com/<chip>``: what the scheduler writes reads back (hypothesis), and the
reader keeps accepting every form HAMi has written (before v2.9: UUID and template only; since: memory and core)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from hami.model import AnnotationKeys, ContainerDevice, DeviceKind, ResourceNames
from hami_vendor_ascend.chips import DEFAULT_CHIPS
from hami_vendor_ascend.fit import runtime_annotation, runtime_info, runtime_templates
from hami_vendor_ascend.settings import SOFT_SPLIT, TEMPLATE

B3 = "Ascend910B3"
CHIP = DEFAULT_CHIPS[B3]
KIND = DeviceKind(
    common_word=B3,
    resources=ResourceNames(count=f"huawei.com/{B3}", memory=f"huawei.com/{B3}-memory"),
    annotations=AnnotationKeys(
        to_allocate=f"hami.io/{B3}-devices-to-allocate", allocated=f"hami.io/{B3}-devices-allocated"
    ),
)

uuids = st.from_regex(r"[0-9A-F]{8}-[0-9A-F]{8}", fullmatch=True)
grants = st.builds(
    ContainerDevice, uuid=uuids, type=st.just(B3), usedmem=st.integers(0, 65536), usedcores=st.integers(0, 100)
)
placements = st.lists(st.lists(grants, max_size=3).map(tuple), max_size=4).map(tuple)


@settings(max_examples=200, deadline=None)
@given(placements, st.sampled_from([TEMPLATE, SOFT_SPLIT]))
def test_what_is_written_reads_back(placement: tuple[tuple[ContainerDevice, ...], ...], mode: str) -> None:
    value = runtime_info(placement, CHIP, mode)  # type: ignore[arg-type]
    entries = json.loads(value)
    flat = [d for devices in placement for d in devices]
    assert [e["UUID"] for e in entries] == [d.uuid for d in flat]  # one entry per device, container order
    for entry, d in zip(entries, flat, strict=True):
        assert entry.get("memory", 0) == d.usedmem
        assert entry.get("core", 0) == d.usedcores
    expected: dict[str, str] = {}
    if mode == TEMPLATE:
        for d in flat:
            template = CHIP.template_for(d.usedmem)
            if template is not None:
                expected[d.uuid] = template.name
    assert runtime_templates({runtime_annotation(KIND): value}, KIND) == expected


def test_every_form_hami_wrote_is_read() -> None:
    key = runtime_annotation(KIND)
    before_v29 = '[{"UUID":"A","temp":"vir05_1c_16g"},{"UUID":"B"}]'
    since_v29 = '[{"UUID":"A","temp":"vir05_1c_16g","memory":16384},{"UUID":"B","memory":65536}]'
    soft = '[{"UUID":"A","memory":16384,"core":30}]'
    assert runtime_templates({key: before_v29}, KIND) == {"A": "vir05_1c_16g"}
    assert runtime_templates({key: since_v29}, KIND) == {"A": "vir05_1c_16g"}
    assert runtime_templates({key: soft}, KIND) == {}
    assert runtime_templates({key: "not json"}, KIND) == {}
