"""`hami doctor`'s Moore Threads checks (`hami_doctor_checks`): MTML, mthreads-gmi, the device nodes, the container
runtime, the grant directories; in a container, the memory mthreads-gmi reports against the grant.

Owns only what is Moore Threads': opening MTML through the binding (`hami_vendor_mthreads.mtml`), reading
``mthreads-gmi -q`` through discovery's own reader (`hami_vendor_mthreads.gmi`), the device node and runtime names.
The judging and wording are core's (`hami.vendorchecks`).
"""

from __future__ import annotations

from hami import vendorchecks
from hami.findings import Finding
from hami.isolation.containers import ContainerDirs
from hami.isolation.grant import Grant
from hami_vendor_mthreads import gmi
from hami_vendor_mthreads.mtml import Mtml
from hami_vendor_mthreads.settings import MthreadsSettings

__all__ = ["checks"]

DEVICE_NODES = ("mtgpu.[0-9]*", "dri/renderD*")
RUNTIME = ("mthreads-container-runtime",)


def checks(settings: MthreadsSettings, grant: Grant | None) -> list[Finding]:
    if grant is not None:
        return [
            vendorchecks.tool_memory_against_grant(
                "mthreads-gmi", grant, lambda: [g.memory_total >> 20 for g in gmi.read_gpus(settings.mthreads_gmi).gpus]
            )
        ]

    def read_mtml() -> tuple[str, int]:
        session = Mtml.open(settings.mtml_library)
        try:
            report = session.read()
        finally:
            session.close()
        return session.where, len(report.gpus)

    def read_tool(exe: str) -> str:
        report = gmi.read_gpus(exe)
        problems = f"; {len(report.problems)} block(s) unread: {report.problems[0]}" if report.problems else ""
        return f"{len(report.gpus)} GPU(s){problems}"

    library = vendorchecks.management_library("libmtml.so", "mtmlLibrary", read_mtml)
    nodes = vendorchecks.device_nodes(DEVICE_NODES)
    absent = vendorchecks.driver(library, DEVICE_NODES, "Moore Threads")
    if absent is not None:
        return absent
    tool = vendorchecks.tool(settings.mthreads_gmi, read_tool, needed_for="discovery's fallback without MTML")
    return [
        vendorchecks.fallback(library, tool, "mthreads-gmi"),
        tool,
        nodes,
        vendorchecks.runtime_hook(RUNTIME, "it gives containers the GPUs their MTHREADS_VISIBLE_DEVICES names"),
        vendorchecks.grant_root(ContainerDirs(settings.hook_path).grants),
    ]
