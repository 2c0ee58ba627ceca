"""Discovery's fallback: ``cnmon`` (Neuware's monitor) where ``libcndev.so`` cannot be loaded.

Owns running ``cnmon`` (no arguments: its default table) and reading its card rows. The table (CNMON 5.x) gives
each card two rows between ``+---`` separators, after the ``|===`` header rule and before ``Processes``:

    | 0     /   MLU370-X8    v1.1.6 |         0000:13:00.0 | 0%                  0 |
    |  0%   28C        107 W/ 250 W |     0 MiB/ 20638 MiB | FULL          Default |

read as the card index, its name, its PCI bus id and its memory (MiB). The table has no UUID, no core count and
no health: a card read from cnmon is named after its bus id, ``MLU-bus-<domain>-<bus>-<device>.<function>``
(HAMi's device strings use ``:`` as a separator), has 0 cores and counts as healthy. Its CNDev index is the
table's card number, so device nodes and profiles still name the right card.

A card whose rows cannot be read raises nothing for the others: the card is left out and the problem, naming the
tool and the line, is returned with the cards (`CnmonReport`), so the node keeps serving the rest. A tool that is
missing, fails or prints no card raises `CnmonError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hami.vendortool import ToolError, run_tool
from hami_vendor_cambricon.cndev import MluCard

__all__ = ["CnmonError", "CnmonReport", "parse", "read_cards"]

_BUS = r"([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])"
_FIRST = re.compile(r"^\|\s*(\d+)\s+(\S+)\s+(\S+)\s+\S+\s*\|\s*" + _BUS + r"\s*\|.*\|\s*$")
_SECOND = re.compile(r"^\|[^|]*\|\s*(\d+)\s*MiB\s*/\s*(\d+)\s*MiB\s*\|.*\|\s*$")
_ROW = re.compile(r"^\|.*\|\s*$")


class CnmonError(ToolError):
    """cnmon could not be run or printed no card."""


@dataclass
class CnmonReport:
    cards: list[MluCard]
    problems: list[str] = field(default_factory=list)


def parse(output: str, tool: str = "cnmon") -> CnmonReport:
    """The cards in `output` (see the module's docstring)."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|=")), None)
    if start is None:
        raise CnmonError(f"{tool} printed no card table (no '|===' header rule)")
    cards: list[MluCard] = []
    problems: list[str] = []
    rows: list[tuple[int, str]] = []
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if "Processes" in line:
            break
        if _ROW.match(line.strip()):
            rows.append((number, line.strip()))
        elif line.strip() and not line.startswith("+"):
            problems.append(f"{tool} line {number}: cannot read {line.strip()!r} (expected a '| … |' table row)")
    seen: set[int] = set()
    pending = iter(rows)
    for number, line in pending:
        first = _FIRST.match(line)
        if first is None:
            problems.append(f"{tool} line {number}: cannot read {line!r} (expected '| <card> <VF> <name> <firmware> "
                            "| <bus id> | <util> <ecc> |'); its card is not reported")  # fmt: skip
            next(pending, None)  # the card's second row goes with it
            continue
        second_at, second = next(pending, (number + 1, ""))
        memory = _SECOND.match(second)
        if memory is None:
            problems.append(f"{tool} line {second_at}: cannot read {second!r} (expected '| … | <used> MiB/ <total> "
                            f"MiB | … |'); card {first.group(1)} is not reported")  # fmt: skip
            continue
        index = int(first.group(1))
        if index in seen:
            problems.append(f"{tool} line {number}: card {index} is listed twice; the second is not reported")
            continue
        seen.add(index)
        bus = "-".join(first.group(g).lower() for g in (4, 5, 6)) + "." + first.group(7)
        cards.append(MluCard(index, f"MLU-bus-{bus}", first.group(3), int(memory.group(2)), 0, True))
    if not cards and not problems:
        raise CnmonError(f"{tool} printed no card row")
    return CnmonReport(cards, problems)


def read_cards(command: str = "cnmon", timeout: float = 30.0) -> CnmonReport:
    """Run cnmon and read its cards.

    :raises CnmonError: cnmon could not be run (`hami.vendortool.run_tool`) or printed no card."""
    try:
        output = run_tool(command, timeout=timeout)
    except ToolError as exc:
        raise CnmonError(str(exc)) from None
    return parse(output, command)
