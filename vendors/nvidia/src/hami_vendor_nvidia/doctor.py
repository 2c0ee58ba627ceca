"""`hami doctor`'s NVIDIA checks (`hami_doctor_checks`): NVML, nvidia-smi, the CUDA driver against libvgpu.so's
hooks, the device nodes, the runtime's CDI specification, the grant directories; in a container, what nvidia-smi
reports against the grant.

Owns what is NVIDIA's in those checks: opening NVML through the vendor's binding (`hami_vendor_nvidia.nvml`), the
query `nvidia-smi --query-gpu=index,uuid,driver_version,memory.total --format=csv,noheader,nounits` and reading
its lines, and `NEWEST_HOOKED_CUDA`, the newest CUDA driver API version for which the isolation library maps
``cuGetProcAddress``'s answers to its hooks (``g_variants`` in ``core/src/hami/isolation/cuda/driver.c``; a test
holds the two equal). Judging and wording are core's (`hami.vendorchecks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hami import vendorchecks
from hami.findings import Finding, failed, ok, warning
from hami.isolation.containers import ContainerDirs
from hami.isolation.grant import Grant
from hami.vendortool import run_tool
from hami_vendor_nvidia.edits import CDI_KIND
from hami_vendor_nvidia.nvml import Nvml
from hami_vendor_nvidia.settings import NvidiaSettings

__all__ = ["NEWEST_HOOKED_CUDA", "OLDEST_CUDA", "checks", "parse_smi"]

NEWEST_HOOKED_CUDA = 12050
"""The highest CUDA version in libvgpu.so's ``cuGetProcAddress`` table (cuCtxCreate_v4, CUDA 12.5)."""
OLDEST_CUDA = 11030
"""``cuGetProcAddress`` exists from CUDA 11.3; older drivers are reached through ``dlsym`` alone."""
SMI = "nvidia-smi"
SMI_QUERY = ["--query-gpu=index,uuid,driver_version,memory.total", "--format=csv,noheader,nounits"]
DEVICE_NODES = ("nvidia[0-9]*", "nvidiactl", "nvidia-uvm")
RUNTIME = ("nvidia-container-runtime", "nvidia-container-toolkit", "nvidia-cdi-hook")
"""What a runtime set up by the NVIDIA Container Toolkit names (``nvidia-ctk runtime configure``)."""


def _version(cuda: int) -> str:
    return f"{cuda // 1000}.{cuda % 1000 // 10}"


def parse_smi(text: str) -> list[tuple[int, str, str, int]]:
    """(index, UUID, driver version, total memory MiB) per line of the query's output.

    :raises ValueError: a line is not four comma-separated fields of those kinds (names the line)."""
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if (
            len(fields) != 4
            or not fields[0].isdigit()
            or not fields[3].isdigit()
            or not fields[1].startswith(("GPU-", "MIG-"))
        ):
            raise ValueError(f"line {n} is not 'index, uuid, driver_version, memory.total': {line.strip()[:120]!r}")
        rows.append((int(fields[0]), fields[1], fields[2], int(fields[3])))
    if not rows:
        raise ValueError("it printed no GPU")
    return rows


def _smi(exe: str) -> str:
    rows = parse_smi(run_tool(exe, SMI_QUERY, timeout=20))
    return f"driver {rows[0][2]}, {len(rows)} GPU(s)"


def checks(settings: NvidiaSettings, grant: Grant | None) -> list[Finding]:
    if grant is not None:
        return [
            vendorchecks.tool_memory_against_grant(
                SMI, grant, lambda: [row[3] for row in parse_smi(run_tool(SMI, SMI_QUERY, timeout=20))]
            )
        ]
    seen: dict[str, object] = {}

    def read_nvml() -> tuple[str, int]:
        with Nvml.open(settings.nvml_library) as nvml:
            seen["gpus"] = nvml.gpus()
            seen["cuda"] = nvml.cuda_driver_version()
            where = settings.nvml_library or vendorchecks.loaded_path("libnvidia-ml.so.1") or "libnvidia-ml.so.1"
            return f"{where}, driver {nvml.driver_version()}", nvml.count

    library = vendorchecks.management_library("libnvidia-ml.so.1", "nvmlLibrary", read_nvml)
    nodes = vendorchecks.device_nodes(DEVICE_NODES)
    absent = vendorchecks.driver(library, DEVICE_NODES, "NVIDIA")
    if absent is not None:
        return absent
    findings = [library, vendorchecks.tool(SMI, _smi, needed_for="what users check their limit with, in a container")]
    if "cuda" in seen:
        findings.append(_cuda(seen["cuda"]))  # type: ignore[arg-type]
    findings.append(nodes)
    gpus: Sequence[object] = seen.get("gpus") or []  # type: ignore[assignment]
    names = [g.uuid for g in gpus]  # type: ignore[attr-defined]
    if "envvar" in settings.device_list_strategy:
        findings.append(
            vendorchecks.runtime_hook(RUNTIME, "it gives a container the GPUs NVIDIA_VISIBLE_DEVICES names")
        )
    if "cdi-cri" in settings.device_list_strategy:
        findings.append(
            vendorchecks.cdi_spec(
                CDI_KIND,
                names,
                alternative="check that the runtime uses nvidia-container-runtime (nvidia-ctk runtime configure)",
            )
        )
    findings.append(vendorchecks.grant_root(Path(ContainerDirs(settings.vgpu_dir).grants)))
    return findings


def _cuda(cuda: int | None) -> Finding:
    check = "CUDA driver against the hooks"
    if cuda is None:
        return warning(
            check,
            "NVML does not say which CUDA version the driver implements",
            "run nvidia-smi: its header says the CUDA version; compare it with 12.5 (the newest libvgpu.so maps)",
        )
    if cuda < OLDEST_CUDA:
        return ok(
            check,
            f"CUDA {_version(cuda)}: before cuGetProcAddress, every function is reached through dlsym, "
            "which the library answers",
        )
    if cuda // 1000 > NEWEST_HOOKED_CUDA // 1000:
        return failed(
            check,
            f"the driver implements CUDA {_version(cuda)}; libvgpu.so maps cuGetProcAddress's answers up to CUDA "
            f"{_version(NEWEST_HOOKED_CUDA)}: a function version introduced since may reach the driver unhooked",
            "run benchmarks/gpu/validate.sh on this node before sharing it (it checks every limit with real "
            "frameworks), or pin a driver of CUDA 12",
        )
    if cuda > NEWEST_HOOKED_CUDA:
        return warning(
            check,
            f"CUDA {_version(cuda)} is newer than the newest version libvgpu.so maps ({_version(NEWEST_HOOKED_CUDA)})",
            "run benchmarks/gpu/validate.sh on this node once to confirm the limits hold",
        )
    return ok(check, f"CUDA {_version(cuda)}: every version cuGetProcAddress hands out maps to a hook")
