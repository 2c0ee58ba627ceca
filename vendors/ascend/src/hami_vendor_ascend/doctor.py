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
RUNTIME = ("ascend-docker-runtime", "ascend-docker-hook")


def checks(settings: AscendSettings, grant: Grant | None) -> list[Finding]:
    if grant is not None:
        return [
            vendorchecks.tool_memory_against_grant(
                "npu-smi", grant, lambda: [c.memory_mib or 0 for c in npusmi.read_chips(settings.npu_smi)]
            )
        ]

    def read_dcmi() -> tuple[str, int]:
        session = Dcmi.open(settings.dcmi_library)
        return session.where, len(session.chips())

    def read_tool(exe: str) -> str:
        chips = npusmi.read_chips(exe)
        return f"{len(chips)} chip(s): {', '.join(sorted({c.chip_name for c in chips}))}"

    library = vendorchecks.management_library("libdcmi.so", "dcmiLibrary", read_dcmi)
    nodes = vendorchecks.device_nodes(DEVICE_NODES)
    absent = vendorchecks.driver(library, DEVICE_NODES, "Ascend")
    if absent is not None:
        return absent
    tool = vendorchecks.tool(settings.npu_smi, read_tool, needed_for="discovery's fallback without DCMI")
    return [
        vendorchecks.fallback(library, tool, "npu-smi"),
        tool,
        nodes,
        vendorchecks.runtime_hook(RUNTIME, "it mounts the driver and the NPUs' device nodes into containers"),
        vendorchecks.grant_root(ContainerDirs(settings.hook_path).grants),
    ]
