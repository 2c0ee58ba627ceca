"""`hami doctor`'s Hygon checks (`hami_doctor_checks`): ROCm SMI (and DMI, the virtualization library), hy-smi, the
device nodes, the grant directories; in a container, the memory hy-smi reports against the grant.

Owns only what is Hygon's: opening the libraries through the binding (`hami_vendor_hygon.dtk`), reading hy-smi
through discovery's own reader (`hami_vendor_hygon.hysmi`) and the device node names. The judging and wording are
core's (`hami.vendorchecks`).
"""

from __future__ import annotations

from hami import vendorchecks
from hami.findings import Finding, ok, warning
from hami.isolation.containers import ContainerDirs
from hami.isolation.grant import Grant
from hami_vendor_hygon import hysmi
from hami_vendor_hygon.dtk import Dmi, Rsmi
from hami_vendor_hygon.settings import HygonSettings

__all__ = ["checks"]

DEVICE_NODES = ("kfd", "dri/renderD*")


def checks(settings: HygonSettings, grant: Grant | None) -> list[Finding]:
    def read_rsmi() -> tuple[str, int]:
        session = Rsmi.open(settings.rocm_smi_library)
        return session.where, len(session.devices())

    def read_tool(exe: str) -> str:
        report = hysmi.read_devices(exe)
        problems = f"; {len(report.problems)} line(s) unread: {report.problems[0]}" if report.problems else ""
        return f"{len(report.devices)} DCU(s){problems}"

    return vendorchecks.library_else_tool(
        grant,
        vendor="Hygon",
        library="librocm_smi64.so",
        setting="rocmSmiLibrary",
        read_library=read_rsmi,
        library_words="ROCm SMI",
        tool_name="hy-smi",
        command=settings.hy_smi,
        read_tool=read_tool,
        tool_memory=lambda: [d.memory_total >> 20 for d in hysmi.read_devices(settings.hy_smi).devices],
        device_patterns=DEVICE_NODES,
        grants=ContainerDirs(settings.hook_path).grants,
        more=[lambda: _dmi(settings)],
    )


def _dmi(settings: HygonSettings) -> Finding:
    """DMI is optional: without it devices are served whole or as configured vDCUs, none created by the driver."""
    try:
        session = Dmi.open(settings.dmi_library)
    except Exception as exc:
        return warning(
            "virtualization library",
            f"libhydmi.so could not be used: {exc}",
            "install DTK's hydmi (or set dmiLibrary) to create vDCUs through the driver",
        )
    return ok("virtualization library", session.where)
