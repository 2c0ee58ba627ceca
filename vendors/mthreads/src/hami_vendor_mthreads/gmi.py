"""Discovery's fallback: ``mthreads-gmi -q`` where ``libmtml.so`` cannot be loaded.

Owns running ``mthreads-gmi -q`` and reading its per-GPU blocks: a block starts with a line ``GPU<n>`` (or
``GPU <n>``) at the start of a line, and holds indented ``<field> : <value>`` lines: ``Product Name``
(``MTT S4000``), ``GPU UUID``, ``Bus Id`` (optional, the PCI address), and under a section whose title names
``Memory`` (``FB Memory Usage``), ``Total`` and ``Used`` with a unit (``49152MiB``, ``48GiB``, ``MB``).
The tool's banner, other sections and other fields are skipped; field names are compared without case.

A block that cannot be read raises nothing for the others: the GPU is left out and the problem, naming the tool
and the line, is returned with the GPUs (`GmiReport`), so the node keeps serving the rest. A tool that is
missing, fails or prints no GPU block raises `GmiError`. The layout is taken from third-party captures of
``mthreads-gmi -q``; it is to be checked against the real tool.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field

from hami.vendortool import ToolError
from hami_vendor_mthreads.mtml import MtGpu

__all__ = ["ARGS", "GmiError", "GmiReport", "parse", "read_gpus"]

ARGS = ("-q",)
_BLOCK = re.compile(r"^GPU\s*(\d+)\s*$")
_FIELD = re.compile(r"^(\s+)([^:]+?)\s*:\s*(.*?)\s*$")
_SECTION = re.compile(r"^(\s+)([^:]+?)\s*$")
_SIZE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*(MiB|MB|GiB|GB|KiB|KB|B)?$", re.IGNORECASE)
_BDF = re.compile(r"^(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_BYTES = {"b": 1, "kib": 1024, "kb": 1024, "mib": 1024**2, "mb": 1024**2, "gib": 1024**3, "gb": 1024**3}


class GmiError(ToolError):
    """mthreads-gmi could not be run or printed nothing usable."""


@dataclass
class GmiReport:
    gpus: list[MtGpu]
    problems: list[str] = field(default_factory=list)


def _bytes(text: str) -> int:
    m = _SIZE.match(text.strip())
    if not m:
        raise ValueError(text)
    return int(float(m.group(1)) * _BYTES[(m.group(2) or "MiB").lower()])


@dataclass
class _Block:
    index: int
    line: int
    fields: dict[str, tuple[int, str]] = field(default_factory=dict)
    bad: str = ""


def parse(output: str, tool: str = "mthreads-gmi") -> GmiReport:
    """The GPUs in `output` (see the module's docstring)."""
    blocks: list[_Block] = []
    section = ""
    section_indent = -1
    for number, line in enumerate(output.splitlines(), 1):
        if not line.strip():
            continue
        head = _BLOCK.match(line)
        if head:
            blocks.append(_Block(int(head.group(1)), number))
            section, section_indent = "", -1
            continue
        if not blocks or not line[:1].isspace():
            continue
        block = blocks[-1]
        f = _FIELD.match(line)
        if f is None:
            s = _SECTION.match(line)
            if s:
                section, section_indent = s.group(2).strip().lower(), len(s.group(1))
            continue
        indent, name, value = len(f.group(1)), f.group(2).strip().lower(), f.group(3)
        if section and indent <= section_indent:
            section, section_indent = "", -1
        key = f"{section}/{name}" if section and "memory" in section else name
        if name in ("product name", "gpu uuid", "bus id", "total", "used") and not value:
            block.bad = block.bad or f"{tool} line {number}: {name!r} has no value"
        block.fields.setdefault(key, (number, value))
    if not blocks:
        raise GmiError(f"{tool} printed no GPU block (a line 'GPU<n>' followed by '<field> : <value>' lines)")
    gpus: list[MtGpu] = []
    problems: list[str] = []
    for block in blocks:
        if block.bad:
            problems.append(f"{block.bad}; GPU {block.index} is not reported")
            continue
        got = block.fields
        missing = [k for k in ("product name", "gpu uuid") if k not in got]
        total_key = next((k for k in got if k.endswith("/total")), None)
        used_key = next((k for k in got if k.endswith("/used")), None)
        if missing or total_key is None:
            what = ", ".join(repr(k) for k in missing) or "a memory 'Total'"
            problems.append(f"{tool} line {block.line}: GPU {block.index} has no {what} field; it is not reported")
            continue
        try:
            number, text = got[total_key]
            total = _bytes(text)
            used = 0
            if used_key is not None:
                number, text = got[used_key]
                used = _bytes(text)
        except ValueError:
            problems.append(f"{tool} line {number}: {text!r} is not a memory size; GPU {block.index} is not reported")
            continue
        bdf = ""
        if "bus id" in got:
            number, text = got["bus id"]
            if not _BDF.match(text):
                problems.append(f"{tool} line {number}: Bus Id {text!r} is not a PCI address; GPU {block.index} "
                                "is not reported")  # fmt: skip
                continue
            bdf = text
        gpus.append(MtGpu(index=block.index, uuid=got["gpu uuid"][1], name=got["product name"][1], bdf=bdf,
                          memory_total=total, memory_used=used))  # fmt: skip
    return GmiReport(gpus, problems)


def read_gpus(command: str = "mthreads-gmi", timeout: float = 30.0) -> GmiReport:
    """Run ``mthreads-gmi -q`` and read its GPUs."""
    exe = shutil.which(command)
    if exe is None:
        raise GmiError(f"{command} not found")
    try:
        done = subprocess.run([exe, *ARGS], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GmiError(f"{command} could not be run: {exc}") from None
    if done.returncode != 0:
        raise GmiError(f"{command} exited with {done.returncode}: {done.stderr.strip()[:200]}")
    return parse(done.stdout, command)
