"""Discovery's fallback where DCMI is absent: running ``npu-smi info`` and reading its table.

Owns the text format of ``npu-smi info`` (two rows per chip between ``+---`` rules):

    | NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
    | Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
    +===========================+===============+====================================================+
    | 0     910B3               | OK            | 70.0        34                0    / 0             |
    | 0                         | 0000:C1:00.0  | 0           1197 / 13553      1365 / 65536         |

The first row of a chip gives the NPU id, the chip name and the health; the second the chip's position in the
NPU, on 310P a ``Device`` column (the device id), the PCI bus id, and the memory in use over the total: HBM where
the chip has it, else the ``Memory-Usage`` column (310P's DDR). The process table that follows (``Process id``) ends
the chips. The values become the same `NpuChip` records as DCMI's; what the table does not tell is filled in:

- the physical id: the ``Device`` column where there is one, else the NPU id for one-chip NPUs, else the chip's
  position in the table;
- the UUID: ``NPU-<bus id>`` (``:`` written as ``-``): stable on the node while DCMI stays absent, but not the die
  id DCMI gives, so a node should not switch between the two while pods are placed on it;
- AI cores: unknown (the configuration's count is registered).

`parse_info` is pure; `read_chips` runs the command. A missing command, a failing one, or a table without chips
raises `NpuSmiError` with what went wrong.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import shutil
import subprocess

from hami.vendortool import ToolError
from hami_vendor_ascend.dcmi import NpuChip

__all__ = ["NpuSmiError", "parse_info", "read_chips"]

_USAGE = re.compile(r"(\d+)\s*/\s*(\d+)")
_BUS = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")


class NpuSmiError(ToolError):
    """npu-smi could not be run or its output not read (core's `hami.vendortool.ToolError`, so that
    `hami.vendordriver.DriverReader` reports the node's chips as none)."""


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _ints(text: str) -> list[int] | None:
    parts = text.split()
    return [int(p) for p in parts] if parts and all(p.isdigit() for p in parts) else None


def parse_info(text: str) -> list[NpuChip]:
    """The chips of an ``npu-smi info`` table, in table order.

    :raises NpuSmiError: the text has no chip table.
    """
    chips: list[NpuChip] = []
    first: tuple[int, str, str] | None = None  # NPU id, name, health of the row waiting for its second row
    has_device_column = False
    in_table = False
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = _cells(line)
        head = cells[0].split()
        if "Process id" in line or "Process name" in line:
            break
        if head[:2] == ["NPU", "Name"]:
            in_table = True
            continue
        if head[:1] == ["Chip"]:
            has_device_column = head[1:2] == ["Device"]
            continue
        if not in_table or len(cells) < 3:
            continue
        if len(head) >= 2 and head[0].isdigit() and not head[1].isdigit():
            first = (int(head[0]), " ".join(head[1:]), cells[1])
            continue
        numbers = _ints(cells[0])
        if first is None or numbers is None:
            continue
        npu, name, health = first
        first = None
        chip_index = numbers[0]
        device = numbers[1] if has_device_column and len(numbers) > 1 else None
        bus = cells[1]
        usages = [(int(a), int(b)) for a, b in _USAGE.findall(cells[2])]
        memory = usages[-1][1] if usages else None  # HBM when listed (the last column), else Memory-Usage
        chips.append(
            NpuChip(
                card_id=npu,
                device_id=chip_index,
                logic_id=len(chips),
                phy_id=device if device is not None else -1,
                chip_type="Ascend",
                chip_name=name,
                ai_cores=None,
                health=0 if health.upper() == "OK" else 1,
                uuid=f"NPU-{bus.replace(':', '-')}" if _BUS.match(bus) else None,
                memory_mib=memory or None,
            )
        )
    if not chips:
        if not in_table:
            raise NpuSmiError("the output has no chip table (no 'NPU  Name' header)")
        return []
    per_npu: dict[int, int] = {}
    for chip in chips:
        per_npu[chip.card_id] = per_npu.get(chip.card_id, 0) + 1
    fixed = []
    for position, chip in enumerate(chips):
        if chip.phy_id < 0:
            phy = chip.card_id if per_npu[chip.card_id] == 1 else position
            chip = dataclasses.replace(chip, phy_id=phy)
        fixed.append(chip)
    return fixed


def read_chips(command: str, timeout: float = 20.0) -> list[NpuChip]:
    """Run ``<command> info`` and read its chips.

    :raises NpuSmiError: the command is missing, fails, times out or prints no chip table.
    """
    argv = [*shlex.split(command), "info"]
    if shutil.which(argv[0]) is None:
        raise NpuSmiError(f"{argv[0]} is not installed (not found on PATH)")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise NpuSmiError(f"{shlex.join(argv)} did not answer within {timeout:.0f} s") from None
    except OSError as exc:
        raise NpuSmiError(f"{shlex.join(argv)} could not be run: {exc}") from None
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise NpuSmiError(f"{shlex.join(argv)} exited {proc.returncode}: {detail[-1] if detail else 'no output'}")
    return parse_info(proc.stdout)
