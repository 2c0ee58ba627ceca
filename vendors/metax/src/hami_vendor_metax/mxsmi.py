"""Discovery's fallback: ``mx-smi`` where ``libmxsml.so`` cannot be loaded.

Owns running MetaX's ``mx-smi`` twice and reading what it prints:

* ``mx-smi -L``: one line per GPU, ``GPU#<i>  <name>  <BDF>  <state> (UUID: <uuid>)``: index, device name, PCI
  address, health (``Available`` is healthy) and UUID;
* ``mx-smi`` (its default table): per GPU a row ``| <i>  <name> | <BDF> | <util> |`` followed by a row whose
  middle cell is the memory use, ``<used>/<total> MiB``: the VRAM.

The two are joined by PCI address. Banner, rule and header lines are skipped. A GPU line or memory cell that
cannot be read raises nothing for the others: that GPU is left out and the problem, naming the tool, the command
and the line, is returned with the devices (`MxSmiReport`), so the node keeps serving the rest. A tool that is
missing, fails or lists no GPU raises `MxSmiError`. mx-smi reports no MetaXLink topology here: without MXSML a
node publishes no links.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field

from hami.vendortool import ToolError
from hami_vendor_metax.mxsml import MetaxGpu

__all__ = ["MxSmiError", "MxSmiReport", "parse", "read_devices"]

_LIST = re.compile(r"^\s*GPU#(\d+)\s+(\S+)\s+([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(\S+)\s+"
                   r"\(UUID:\s*([^\s)]+)\s*\)\s*$")  # fmt: skip
_GPU_ROW = re.compile(r"^\|\s*(\d+)\s+.*?\|\s*([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s*\|")
_MEMORY = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*MiB\s*$")
MIB = 1024 * 1024


class MxSmiError(ToolError):
    """mx-smi could not be run or printed nothing usable."""


@dataclass
class MxSmiReport:
    devices: list[MetaxGpu]
    problems: list[str] = field(default_factory=list)


def _memory(table: str, tool: str, problems: list[str]) -> dict[str, tuple[int, int]]:
    """PCI address → (total, used) bytes, from the default table."""
    out: dict[str, tuple[int, int]] = {}
    lines = table.splitlines()
    for number, line in enumerate(lines, 1):
        m = _GPU_ROW.match(line)
        if not m:
            continue
        bdf = m.group(2).lower()
        following = lines[number] if number < len(lines) else ""
        cells = [c.strip() for c in following.strip().strip("|").split("|")]
        memory = _MEMORY.match(cells[1]) if len(cells) >= 3 else None
        if memory is None:
            problems.append(
                f"{tool} line {number + 1}: cannot read the memory of GPU {m.group(1)} ({bdf}) from "
                f"{following.strip()!r} (expected '| <temp> <power> | <used>/<total> MiB | <state> |')"
            )
            continue
        out[bdf] = (int(memory.group(2)) * MIB, int(memory.group(1)) * MIB)
    return out


def parse(listing: str, table: str, tool: str = "mx-smi") -> MxSmiReport:
    """The devices in ``mx-smi -L`` output `listing` with the memory of table `table` (see the module)."""
    problems: list[str] = []
    memory = _memory(table, tool, problems)
    devices = []
    for number, line in enumerate(listing.splitlines(), 1):
        if not line.strip().startswith("GPU#"):
            continue
        m = _LIST.match(line)
        if not m:
            problems.append(
                f"{tool} -L line {number}: cannot read {line.strip()!r} "
                "(expected 'GPU#<i> <name> <dddd:bb:dd.f> <state> (UUID: <uuid>)'); that GPU is not reported"
            )
            continue
        index, name, bdf, state, uuid = int(m.group(1)), m.group(2), m.group(3).lower(), m.group(4), m.group(5)
        if bdf not in memory:
            problems.append(f"{tool}: GPU {index} ({bdf}) has no memory row in the table; it is not reported")
            continue
        total, used = memory[bdf]
        devices.append(MetaxGpu(index, uuid, bdf, name, total, used, healthy=state.lower() == "available"))
    if not devices and not problems:
        raise MxSmiError(f"{tool} -L listed no GPU (GPU#<i> <name> <BDF> <state> (UUID: <uuid>))")
    return MxSmiReport(devices, problems)


def _run(exe: str, args: list[str], timeout: float) -> str:
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MxSmiError(f"{exe} {' '.join(args)} could not be run: {exc}") from None
    if done.returncode != 0:
        raise MxSmiError(f"{exe} {' '.join(args)} exited with {done.returncode}: {done.stderr.strip()[:200]}")
    return done.stdout


def read_devices(command: str = "mx-smi", timeout: float = 30.0) -> MxSmiReport:
    """Run mx-smi (``-L`` and the table) and read its devices."""
    exe = shutil.which(command)
    if exe is None:
        raise MxSmiError(f"{command} not found")
    return parse(_run(exe, ["-L"], timeout), _run(exe, [], timeout), command)
