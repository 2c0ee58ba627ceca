"""`hami.vendorstate.devices_named`: a placement's device names turned into the devices of the node's last read,
read again once when one is missing, refused with what the node has; HAMi's capacity names and a driverless node's
stand-ins answered by the vendor's rules."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hami.errors import HamiError
from hami.vendorstate import capacity_index, devices_named, trailing_index


@dataclass(frozen=True)
class Card:
    uuid: str
    index: int


A, B, C = Card("GPU-a", 0), Card("GPU-b", 1), Card("GPU-c", 2)


def test_the_last_read_answers_without_reading_again_in_the_placements_order() -> None:
    def never() -> list[Card]:
        raise AssertionError("read again although the last read had every device")

    assert devices_named(["GPU-b", "GPU-a"], [A, B], never, what="GPU", name_of=lambda c: c.uuid) == [B, A]


def test_a_name_not_in_the_last_read_is_read_again_once() -> None:
    reads: list[int] = []

    def again() -> list[Card]:
        reads.append(1)
        return [A, B, C]

    assert devices_named(["GPU-c", "GPU-a"], [A], again, what="GPU", name_of=lambda c: c.uuid) == [C, A]
    assert reads == [1]


def test_a_name_the_node_does_not_have_is_refused_with_what_it_has() -> None:
    with pytest.raises(HamiError, match=r"Acme GPU GPU-z is not on this node \(it has GPU-a, GPU-b\): .*outdated view"):
        devices_named(["GPU-a", "GPU-z"], [A], lambda: [B, A], what="Acme GPU", name_of=lambda c: c.uuid)
    with pytest.raises(HamiError, match=r"\(it has no Acme GPU\)"):
        devices_named(["GPU-z"], [], list, what="Acme GPU", name_of=lambda c: c.uuid)


def test_capacity_names_and_stand_ins_answer_by_the_vendors_rules() -> None:
    answers = lambda c, n: c.uuid == n or capacity_index(n, "acme") == c.index  # noqa: E731
    assert devices_named(["node-1-acme-2"], [A, B, C], list, what="GPU", name_of=lambda c: c.uuid,
                         answers=answers) == [C]  # fmt: skip
    stand_in = lambda n: None if trailing_index(n) is None else Card(n, trailing_index(n) or 0)  # noqa: E731
    assert devices_named(["sim-7"], [], list, what="GPU", name_of=lambda c: c.uuid, stand_in=stand_in) == [
        Card("sim-7", 7)
    ]
    assert (capacity_index("node-acme-x", "acme"), trailing_index("no-index")) == (None, None)
