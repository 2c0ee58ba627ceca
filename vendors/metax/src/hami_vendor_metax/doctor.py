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
    if grant is not None:
        return [
            vendorchecks.tool_memory_against_grant(
                "mx-smi", grant, lambda: [g.memory_total >> 20 for g in mxsmi.read_devices(settings.mx_smi).devices]
            )
        ]

    def read_mxsml() -> tuple[str, int]:
        session = Mxsml.open(settings.mxsml_library)
        return session.where, len(session.devices())

    def read_tool(exe: str) -> str:
        report = mxsmi.read_devices(exe)
        problems = f"; {len(report.problems)} line(s) unread: {report.problems[0]}" if report.problems else ""
        return f"{len(report.devices)} GPU(s){problems}"

    library = vendorchecks.management_library("libmxsml.so", "mxsmlLibrary", read_mxsml)
    nodes = vendorchecks.device_nodes(DEVICE_NODES)
    absent = vendorchecks.driver(library, DEVICE_NODES, "MetaX")
    if absent is not None:
        return absent
    tool = vendorchecks.tool(settings.mx_smi, read_tool, needed_for="discovery's fallback without MXSML")
    return [
        vendorchecks.fallback(library, tool, "mx-smi"),
        tool,
        nodes,
        vendorchecks.grant_root(ContainerDirs(settings.hook_path).grants),
    ]
