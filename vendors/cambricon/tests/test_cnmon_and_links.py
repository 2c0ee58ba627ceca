"""Discovery's cnmon fallback (a fake ``cnmon`` printing its documented table) and MLU-Link topology over the fake
CNDev, fed to core's topology-aware choice."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.codec import decode_link_scores
from hami.errors import HamiError
from hami.model import ContainerDevice, ContainerRequest, DeviceUsage, NodeView, Pod, SchedulingPolicy
from hami.plugins import VendorPlugins
from hami_vendor_cambricon import plugin
from hami_vendor_cambricon.cnmon import CnmonError, parse
from hami_vendor_cambricon.fit import LINK_ANNOTATION, fit_nodes

MachineHost = Callable[..., VendorPlugins]
NO_CNDEV = "/nonexistent/libcndev.so"
MACHINE = [(f"a1b2c3d4-0000-0000-0000-00000000000{i}", "MLU370-X8", 24576, 8, 1) for i in range(4)]


def cnmon_table(cards: list[tuple[object, ...]]) -> str:
    """What ``cnmon`` (CNMON 5.x, no arguments) prints for these cards: its documented default table."""
    rule = "+-------------------------------+----------------------+-----------------------+"
    out = [
        "+------------------------------------------------------------------------------+",
        "| CNMON v5.10.22                                               Driver v5.10.22 |",
        rule,
        "| Card  VF  Name       Firmware |               Bus-Id | Util        Ecc-Error |",
        "| Fan   Temp      Pwr:Usage/Cap |         Memory-Usage | Mode     Compute-Mode |",
        "|===============================+======================+=======================|",
    ]
    for i, card in enumerate(cards):
        bus = f"0000:{0x13 + i:02x}:00.0"
        memory = f"0 MiB/ {card[2]} MiB"
        out += [f"| {i:<5} /   {card[1]:<12} v1.1.6 | {bus:>20} | 0%                  0 |",
                f"|  0%   28C        107 W/ 250 W | {memory:>20} | FULL          Default |", rule]  # fmt: skip
    out += ["", "+------------------------------------------------------------------------------+",
            "| Processes:                                                                   |",
            "|  Card  MI  PID     Command Line                             MLU Memory Usage |",
            "|==============================================================================|",
            "|  No running processes found                                                  |",
            "+------------------------------------------------------------------------------+"]  # fmt: skip
    return "\n".join(out) + "\n"


def write_cnmon(directory: Path, output: str, exit_code: int = 0) -> Path:
    """A fake ``cnmon`` in `directory` that prints `output` and exits with `exit_code`."""
    directory.mkdir(parents=True, exist_ok=True)
    text = directory / "cnmon.txt"
    text.write_text(output)
    script = directory / "cnmon"
    script.write_text(f"#!/bin/sh\ncat '{text}'\nexit {exit_code}\n")
    script.chmod(0o755)
    return script


POD = Pod.model_validate({"name": "p", "uid": "0a1b2c3d-0000-4000-8000-000000000001", "containers": [{"name": "c"}]})


def test_without_cndev_the_cards_come_from_cnmon(mlu_node: MachineHost, tmp_path: Path) -> None:
    cnmon = write_cnmon(tmp_path / "bin", cnmon_table(MACHINE[:2]))
    (found,) = mlu_node(cndevLibrary=NO_CNDEV, cnmonPath=str(cnmon)).discover()["cambricon"]
    assert [(d.id, d.index, d.devmem, d.type, d.health) for d in found.devices] == [
        ("MLU-bus-0000-13-00.0", 0, 24576, "MLU370-X8", True),
        ("MLU-bus-0000-14-00.0", 1, 24576, "MLU370-X8", True),
    ]


def test_a_cnmon_row_that_cannot_be_read_is_named_and_the_other_cards_are_served(
    mlu_node: MachineHost, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = cnmon_table(MACHINE[:3]).replace("0 MiB/ 24576 MiB", "0 MiB/ lots MiB", 1)
    cnmon = write_cnmon(tmp_path / "bin", table)
    with caplog.at_level(logging.ERROR, "hami_vendor_cambricon"):
        (found,) = mlu_node(cndevLibrary=NO_CNDEV, cnmonPath=str(cnmon)).discover()["cambricon"]
    assert [d.index for d in found.devices] == [1, 2]
    assert f"{cnmon} line 8: cannot read '|  0%   28C        107 W/ 250 W |     0 MiB/ lots MiB" in caplog.text
    assert "card 0 is not reported" in caplog.text


def test_no_cndev_and_no_cnmon_reports_nothing_and_says_both(
    mlu_node: MachineHost, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    failing = write_cnmon(tmp_path / "bin", "", exit_code=3)
    with caplog.at_level(logging.WARNING, "hami_vendor_cambricon"):
        assert mlu_node(cndevLibrary=NO_CNDEV, cnmonPath="/nonexistent/cnmon").discover()["cambricon"] == []
        assert mlu_node(cndevLibrary=NO_CNDEV, cnmonPath=str(failing)).discover()["cambricon"] == []
    assert "no CNDev (CNDev load failed" in caplog.text
    assert "/nonexistent/cnmon not found: this node reports no Cambricon devices" in caplog.text
    assert "exited with 3" in caplog.text


def test_a_cnmon_node_refuses_shares_and_serves_whole_cards(mlu_node: MachineHost, tmp_path: Path) -> None:
    cnmon = write_cnmon(tmp_path / "bin", cnmon_table(MACHINE[:2]))
    plugins = mlu_node(cndevLibrary=NO_CNDEV, cnmonPath=str(cnmon))
    plugins.discover()
    share = (ContainerDevice(uuid="MLU-bus-0000-14-00.0", type="MLU", usedmem=1024, usedcores=10),)
    with pytest.raises(HamiError, match=r"reads its cards from cnmon .* no sMLU share can be made"):
        plugins.allocate("MLU", POD, 0, share)
    whole = (ContainerDevice(uuid="MLU-bus-0000-14-00.0", type="MLU", usedmem=24576, usedcores=100),)
    plugins.allocate("MLU", POD, 0, whole)
    assert plugins.container_edits("MLU", POD, 0, whole, None).env == {"CAMBRICON_VISIBLE_DEVICES": "1"}


LINES = [*cnmon_table(MACHINE[:2]).splitlines(), "| x |", "|=", "garbage"]


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=400) | st.lists(st.sampled_from(LINES), max_size=20).map("\n".join))
def test_any_cnmon_output_gives_cards_and_problems_or_a_clear_error(text: str) -> None:
    try:
        report = parse(text)
    except CnmonError as exc:
        message = str(exc)
        report = None
    if report is None:
        assert "cnmon printed no card" in message
        return
    assert all(p.startswith("cnmon") for p in report.problems)
    assert len({c.index for c in report.cards}) == len(report.cards)


# ----------------------------------------------------------------------------------------------- MLU-Link

U = [f"a1b2c3d4-0000-0000-0000-00000000000{i}" for i in range(4)]


def linked_machine() -> list[tuple[object, ...]]:
    """Cards 0-1 joined by two ports, 2-3 by one (and a port down on card 3), no link across the pairs."""
    links = [f"{U[1]},{U[1]}", f"{U[0]},{U[0]}", U[3], f"{U[2]},-"]
    return [(U[i], "MLU370-X8", 24576, 8, 1, 1, links[i]) for i in range(4)]


def test_mlu_link_peers_become_link_scores_published_for_the_scheduler(mlu_node: MachineHost) -> None:
    (found,) = mlu_node(linked_machine()).discover()["cambricon"]
    ids = [f"MLU-{u}" for u in U]
    expected = {ids[0]: {ids[1]: 2}, ids[1]: {ids[0]: 2}, ids[2]: {ids[3]: 1}, ids[3]: {ids[2]: 1}}
    assert found.link_scores == expected
    assert decode_link_scores(found.annotations[LINK_ANNOTATION]) == expected
    (plain,) = mlu_node().discover()["cambricon"]  # no MLU-Link: no annotation at all
    assert plain.annotations == {}


def test_links_that_cannot_be_read_leave_the_card_unlinked_and_served(
    mlu_node: MachineHost, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    plugins = mlu_node(linked_machine())
    monkeypatch.setenv("FAKE_CNDEV_FAIL", "cndevGetMLULinkRemoteInfo")
    with caplog.at_level(logging.ERROR, "hami_vendor_cambricon"):
        (found,) = plugins.discover()["cambricon"]
    assert len(found.devices) == 4
    assert found.link_scores == {}
    assert "MLU 0: its MLU-Link peers cannot be read (CNDev cndevGetMLULinkRemoteInfo failed with code 7" in caplog.text


def test_topology_aware_placement_takes_the_linked_pair(mlu_node: MachineHost) -> None:
    (found,) = mlu_node(linked_machine()).discover()["cambricon"]
    view = NodeView(name="n", devices=[DeviceUsage(device=d) for d in found.devices], annotations=found.annotations)
    two = [ContainerRequest(kind="MLU", count=2, memory=0, memory_percentage=100, cores=100)]
    pod = Pod.model_validate({"name": "p", "containers": [{"name": "c"}]})
    policy = SchedulingPolicy(device=("spread", "topology-aware"))
    busy = view.model_copy(deep=True)
    busy.devices[1].used, busy.devices[1].usedcores = 1, 100  # card 1 taken: 0's partner is gone
    for node, wanted in ((view, {0, 1}), (busy, {2, 3})):
        (result,) = fit_nodes(plugin.KIND, pod, two, [node], policy)
        assert result.placement is not None, result.reason
        assert {found.devices[[d.id for d in found.devices].index(c.uuid)].index for c in result.placement[0]} == wanted
