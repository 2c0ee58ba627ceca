"""`hami doctor`'s Cambricon checks (`hami_doctor_checks`): CNDev, cnmon, the device nodes, the grant directories;
in a container, the memory cnmon reports against the grant.

Owns only what is Cambricon's: opening CNDev through the binding (`hami_vendor_cambricon.cndev`), reading cnmon
through discovery's own reader (`hami_vendor_cambricon.cnmon`) and the device node names. The judging and wording
are core's (`hami.vendorchecks`).
"""

from __future__ import annotations

from hami import vendorchecks
from hami.findings import Finding
from hami.isolation.containers import ContainerDirs
from hami.isolation.grant import Grant
from hami_vendor_cambricon import cnmon
from hami_vendor_cambricon.cndev import Cndev
from hami_vendor_cambricon.settings import CambriconSettings

__all__ = ["checks"]

DEVICE_NODES = ("cambricon_dev[0-9]*", "cambricon_ctl")


def checks(settings: CambriconSettings, grant: Grant | None) -> list[Finding]:
    command = settings.cnmon_path or "cnmon"

    def read_cndev() -> tuple[str, int]:
        session = Cndev.open(settings.cndev_library)
        return session.where, len(session.cards())

    def read_tool(exe: str) -> str:
        report = cnmon.read_cards(exe)
        problems = f"; {len(report.problems)} line(s) unread: {report.problems[0]}" if report.problems else ""
        return f"{len(report.cards)} card(s){problems}"

    return vendorchecks.library_else_tool(
        grant,
        vendor="Cambricon",
        library="libcndev.so",
        setting="cndevLibrary",
        read_library=read_cndev,
        library_words="CNDev",
        tool_name="cnmon",
        command=command,
        read_tool=read_tool,
        tool_memory=lambda: [c.memory_mib for c in cnmon.read_cards(command).cards],
        device_patterns=DEVICE_NODES,
        grants=ContainerDirs(settings.hook_path).grants,
    )
