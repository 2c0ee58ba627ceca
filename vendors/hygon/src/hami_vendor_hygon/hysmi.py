"""Discovery's fallback: ``hy-smi`` (DTK's rocm-smi) where ``librocm_smi64.so`` cannot be loaded.

Owns running ``hy-smi --showbus --showserial --showid --showmeminfo vram`` and reading its per-device lines, the
ROCm-SMI line form (``DCU[<i>]<tabs>: <field>: <value>``; newer DTK writes ``HCU[<i>]``, rocm-smi ``GPU[<i>]``):
``PCI Bus``, ``Serial Number``, ``Device ID`` (hex), ``VRAM Total Memory (B)`` and ``VRAM Total Used Memory (B)``
(the field names compared without case). Banner and separator lines (``====``) and other fields are skipped.

A device line that cannot be read raises nothing for the others: the device is left out and the problem, naming
the tool and the line, is returned with the devices (`HySmiReport`), so the node keeps serving the rest. A tool
that is missing, fails or prints no device line raises `HySmiError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hami.vendortool import ToolError, run_tool
from hami_vendor_hygon.dtk import Dcu

__all__ = ["ARGS", "HySmiError", "HySmiReport", "parse", "read_devices"]

ARGS = ("--showbus", "--showserial", "--showid", "--showmeminfo", "vram")
_LINE = re.compile(r"^\s*(?:DCU|HCU|GPU)\[(\d+)\]\s*:\s*(.*)$")
_FIELD = re.compile(r"^([^:]+?)\s*:\s*(.*?)\s*$")
_BDF = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


class HySmiError(ToolError):
    """hy-smi could not be run or printed nothing usable."""


@dataclass
class HySmiReport:
    devices: list[Dcu]
    problems: list[str] = field(default_factory=list)


def _int(text: str, base: int = 10) -> int:
    value = int(text.strip(), base)
    if value < 0:
        raise ValueError("negative")
    return value


def parse(output: str, tool: str = "hy-smi") -> HySmiReport:
    """The devices in `output` (see the module's docstring)."""
    fields: dict[int, dict[str, tuple[int, str]]] = {}
    problems: list[str] = []
    bad: set[int] = set()
    for number, line in enumerate(output.splitlines(), 1):
        m = _LINE.match(line)
        if not m:
            continue
        index, rest = int(m.group(1)), m.group(2)
        f = _FIELD.match(rest)
        if not f or not f.group(2):
            problems.append(f"{tool} line {number}: cannot read {line.strip()!r} (expected '<field>: <value>')")
            bad.add(index)
            continue
        fields.setdefault(index, {})[f.group(1).strip().lower()] = (number, f.group(2))
    if not fields and not problems:
        raise HySmiError(f"{tool} printed no device line (DCU[<i>] : <field>: <value>)")
    devices = []
    for index in sorted(fields):
        if index in bad:  # already reported, by the line that could not be read
            continue
        got = fields[index]
        try:
            bdf_line, bdf = got["pci bus"]
            if not _BDF.match(bdf):
                raise ValueError(f"line {bdf_line}: PCI Bus {bdf!r} is not dddd:bb:dd.f")
            values = []
            for key, base in (("device id", 16), ("vram total memory (b)", 10), ("vram total used memory (b)", 10)):
                line_no, text = got[key]
                try:
                    values.append(_int(text.lower().removeprefix("0x"), base))
                except ValueError:
                    raise ValueError(f"line {line_no}: {key} {text!r} is not a number") from None
            _, serial = got["serial number"]
        except KeyError as exc:
            problems.append(f"{tool}: device {index} has no {exc.args[0]!r} line; it is not reported")
            continue
        except ValueError as exc:
            problems.append(f"{tool} {exc}; device {index} is not reported")
            continue
        devices.append(
            Dcu(
                index=index,
                bdf=bdf.lower(),
                serial=serial,
                device_id=values[0],
                memory_total=values[1],
                memory_used=values[2],
            )
        )
    return HySmiReport(devices, problems)


def read_devices(command: str = "hy-smi", timeout: float = 30.0) -> HySmiReport:
    """Run hy-smi and read its devices."""
    try:
        output = run_tool(command, ARGS, timeout)
    except ToolError as exc:
        raise HySmiError(str(exc)) from None
    return parse(output, command)
