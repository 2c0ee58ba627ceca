"""`hami doctor`'s Iluvatar checks (`hami_doctor_checks`): ixML, ixsmi, the device nodes, the grant directories.

Owns only what is Iluvatar's: opening ixML through the binding (`hami_vendor_iluvatar.ixml`: version and GPUs),
the tool's name and the device node names. ``ixsmi``'s output has no reader in this package (discovery never runs
it), so its check is that it runs; in a container there is no figure to hold against the grant, and the finding
says to run it by hand. The judging and wording are core's (`hami.vendorchecks`).
"""

from __future__ import annotations

from pathlib import Path

from hami import vendorchecks
from hami.findings import Finding, warning
from hami.isolation.containers import ContainerDirs
from hami.isolation.grant import Grant
from hami.vendortool import run_tool
from hami_vendor_iluvatar.ixml import Ixml
from hami_vendor_iluvatar.settings import IluvatarSettings

__all__ = ["checks"]

DEVICE_NODES = ("iluvatar[0-9]*",)
TOOL = "ixsmi"


def _first_line(exe: str) -> str:
    lines = [line.strip() for line in run_tool(exe, timeout=20).splitlines() if line.strip()]
    if not lines:
        raise ValueError("it printed nothing")
    return f"runs ({lines[0][:80]})"


def checks(settings: IluvatarSettings, grant: Grant | None) -> list[Finding]:
    tool_path = str(Path(settings.corex_path) / "bin" / TOOL)
    command = tool_path if Path(tool_path).exists() else TOOL
    if grant is not None:
        return [
            warning(
                "memory the tool reports",
                f"not read: run {TOOL} in the container and compare its memory with the grant",
                f"{TOOL} must show the granted memory, not the card's",
            )
        ]

    def read_ixml() -> tuple[str, int]:
        session = Ixml.open(settings.ixml_library)
        try:
            return f"{session.where}, driver {session.driver_version()}", session.count()
        finally:
            session.close()

    library = vendorchecks.management_library("libixml.so", "ixmlLibrary", read_ixml)
    nodes = vendorchecks.device_nodes(DEVICE_NODES)
    absent = vendorchecks.driver(library, DEVICE_NODES, "Iluvatar")
    if absent is not None:
        return absent
    return [
        library,
        vendorchecks.tool(command, _first_line, needed_for="what users check their GPUs with"),
        nodes,
        vendorchecks.grant_root(ContainerDirs(settings.hook_path).grants),
    ]
