"""`hami doctor`'s Ascend checks (`hami_doctor_checks`): DCMI, npu-smi, the device nodes, Ascend Docker Runtime, the
grant directories; in a container, the memory npu-smi reports against the grant.

Owns only what is Ascend's: opening DCMI through the binding (`hami_vendor_ascend.dcmi`), reading ``npu-smi info``
through discovery's own reader (`hami_vendor_ascend.npusmi`), the device node names and the runtime's name. The
judging and wording are core's (`hami.vendorchecks`).
"""

from __future__ import annotations

from hami import vendorchecks
from hami.findings import Finding
from hami.isolation.containers import ContainerDirs
from hami.isolation.grant import Grant
from hami_vendor_ascend import npusmi
from hami_vendor_ascend.dcmi import Dcmi
from hami_vendor_ascend.settings import AscendSettings

__all__ = ["checks"]

DEVICE_NODES = ("davinci[0-9]*", "davinci_manager", "devmm_svm", "hisi_hdc")
PURPOSE = "it mounts the driver and the NPUs' device nodes into containers"
"""What the runtime hook is for, as the doctor says it."""
RUNTIME = ("ascend-docker-runtime", "ascend-docker-hook")


def checks(settings: AscendSettings, grant: Grant | None) -> list[Finding]:
    def read_dcmi() -> tuple[str, int]:
        session = Dcmi.open(settings.dcmi_library)
        return session.where, len(session.chips())

    def read_tool(exe: str) -> str:
        chips = npusmi.read_chips(exe)
        return f"{len(chips)} chip(s): {', '.join(sorted({c.chip_name for c in chips}))}"

    return vendorchecks.library_else_tool(
        grant,
        vendor="Ascend",
        library="libdcmi.so",
        setting="dcmiLibrary",
        read_library=read_dcmi,
        library_words="DCMI",
        tool_name="npu-smi",
        command=settings.npu_smi,
        read_tool=read_tool,
        tool_memory=lambda: [c.memory_mib or 0 for c in npusmi.read_chips(settings.npu_smi)],
        device_patterns=DEVICE_NODES,
        grants=ContainerDirs(settings.hook_path).grants,
        more=[
            lambda: vendorchecks.runtime_hook(
                RUNTIME, "it mounts the driver and the NPUs' device nodes into containers"
            )
        ],
    )
