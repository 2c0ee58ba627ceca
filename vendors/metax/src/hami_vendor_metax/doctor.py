"""`hami doctor`'s MetaX checks (`hami_doctor_checks`): MXSML, mx-smi, the device nodes, the grant directories; in a
container, the memory mx-smi reports against the grant.

Owns only what is MetaX's: opening MXSML through the binding (`hami_vendor_metax.mxsml`), reading mx-smi through
discovery's own reader (`hami_vendor_metax.mxsmi`) and the device node names. The judging and wording are core's
(`hami.vendorchecks`).
"""

from __future__ import annotations

from hami import vendorchecks
from hami.findings import Finding
from hami.isolation.containers import ContainerDirs
from hami.isolation.grant import Grant
from hami_vendor_metax import mxsmi
from hami_vendor_metax.mxsml import Mxsml
from hami_vendor_metax.settings import MetaxSettings

__all__ = ["checks"]

DEVICE_NODES = ("mxcd", "dri/renderD*")


def checks(settings: MetaxSettings, grant: Grant | None) -> list[Finding]:
    def read_mxsml() -> tuple[str, int]:
        session = Mxsml.open(settings.mxsml_library)
        return session.where, len(session.devices())

    def read_tool(exe: str) -> str:
        report = mxsmi.read_devices(exe)
        problems = f"; {len(report.problems)} line(s) unread: {report.problems[0]}" if report.problems else ""
        return f"{len(report.devices)} GPU(s){problems}"

    return vendorchecks.library_else_tool(
        grant,
        vendor="MetaX",
        library="libmxsml.so",
        setting="mxsmlLibrary",
        read_library=read_mxsml,
        library_words="MXSML",
        tool_name="mx-smi",
        command=settings.mx_smi,
        read_tool=read_tool,
        tool_memory=lambda: [g.memory_total >> 20 for g in mxsmi.read_devices(settings.mx_smi).devices],
        device_patterns=DEVICE_NODES,
        grants=ContainerDirs(settings.hook_path).grants,
    )
