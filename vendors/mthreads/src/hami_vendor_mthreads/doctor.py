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
PURPOSE = "it gives containers the GPUs their MTHREADS_VISIBLE_DEVICES names"
"""What the runtime hook is for, as the doctor says it."""
RUNTIME = ("mthreads-container-runtime",)


def checks(settings: MthreadsSettings, grant: Grant | None) -> list[Finding]:
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

    return vendorchecks.library_else_tool(
        grant,
        vendor="Moore Threads",
        library="libmtml.so",
        setting="mtmlLibrary",
        read_library=read_mtml,
        library_words="MTML",
        tool_name="mthreads-gmi",
        command=settings.mthreads_gmi,
        read_tool=read_tool,
        tool_memory=lambda: [g.memory_total >> 20 for g in gmi.read_gpus(settings.mthreads_gmi).gpus],
        device_patterns=DEVICE_NODES,
        grants=ContainerDirs(settings.hook_path).grants,
        more=[
            lambda: vendorchecks.runtime_hook(
                RUNTIME, "it gives containers the GPUs their MTHREADS_VISIBLE_DEVICES names"
            )
        ],
    )
