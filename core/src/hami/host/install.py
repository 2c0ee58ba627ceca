"""``hami host install`` and ``hami host status``: the libraries on a host of its own, and what each grant uses.

**install.** Each loaded vendor whose package ships an isolation library gets it under
``<prefix>/usr/local/lib/hami/<vendor>/`` (``--libdir``) exactly as the node daemon installs it
(`hami.node.hooklib`: a versioned file ``lib<x>-<version>-<digest>.so`` never written again, the stable name a
symlink switched atomically, and ``ld.so.preload`` naming the stable name). `prefix` is a staging root
(``DESTDIR``): the files name the final paths, without it, so a package build lays out its tree with it
(``packaging/build-deb``). The configuration a container engine needs is printed; ``--write`` also writes it:

* a CDI specification per vendor, ``<prefix>/etc/cdi/hami-<vendor>.json``, kind ``hami.io/<vendor>``, one device
  ``isolation`` that mounts the library at its own path and the preload file at ``/etc/ld.so.preload``
  (read-only): ``docker run --device hami.io/nvidia=isolation`` (Docker 25+ with CDI on, Podman, containerd,
  CRI-O) gives a container the library, its limits then coming from its grant mount or, as in HAMi, its
  environment (docs/host.md);
* the same paths as the flags of ``docker run`` and the options of a VM/container host agent (Cloudpods' host
  service points its library path options at the stable names), printed only.

**status.** Every run ``hami run`` recorded in the state directory (``<state>/runs/<name>.json``) with what its
accounting file says: per device the memory used, its limit and peak, the compute limit, launches, and the live
processes. A record whose accounting file does not exist yet (no process used the device) says so; one that cannot
be read says why. The accounting file is the command's own account of itself (`hami.isolation.accounting`): a
report, not evidence.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hami.errors import HamiError
from hami.isolation import accounting
from hami.node.hooklib import IsolationLibraries, library_source
from hami.plugins import LoadedVendor, VendorPlugins
from hami.validation import nearest

__all__ = [
    "CDI_DIR",
    "LIBRARY_ROOT",
    "HostLibrary",
    "cdi_spec",
    "install",
    "render_install",
    "render_status",
    "status",
    "write_cdi",
]

LIBRARY_ROOT = "/usr/local/lib/hami"
CDI_DIR = "/etc/cdi"
CDI_VERSION = "0.6.0"


@dataclass(frozen=True)
class HostLibrary:
    """One vendor's library as installed on the host (final paths, without the staging prefix)."""

    vendor: str
    version: str
    build: str
    path: str
    preload: str


def _final(path: Path, prefix: Path) -> str:
    return "/" + str(path.relative_to(prefix)) if prefix != Path("/") else str(path)


def install(
    plugins: VendorPlugins, prefix: Path, vendors: Sequence[str] = (), library_root: str = LIBRARY_ROOT
) -> list[HostLibrary]:
    """Install the libraries of the loaded vendors (or of `vendors`) under `prefix` / `library_root` (a package
    uses ``/usr/lib/hami``: ``/usr/local`` is the administrator's). :raises HamiError: a vendor asked for is not
    loaded or ships no library, or the files cannot be written."""
    loaded = {v.name: v for v in plugins.vendors}
    unknown = [name for name in vendors if name not in loaded]
    if unknown:
        near = [n for n in (nearest(name, list(loaded)) for name in unknown) if n]
        hint = f" (did you mean {', '.join(map(repr, near))}?)" if near else ""
        raise HamiError(
            f"hami host install: --vendor: no vendor plugin {', '.join(unknown)} is loaded; loaded: "
            f"{', '.join(loaded) or 'none'}{hint}"
        )
    chosen: Iterable[LoadedVendor] = [loaded[n] for n in vendors] if vendors else loaded.values()
    root = prefix / library_root.lstrip("/")
    libraries = IsolationLibraries(root)
    installed = []
    for vendor in chosen:
        if not vendor.info.isolation_library or library_source(vendor) is None:
            if vendors:
                raise HamiError(f"hami host install: vendor {vendor.name} ships no isolation library")
            continue
        try:
            done = libraries.install(vendor)
            if done is None:
                continue
            final = _final(done.path, prefix)
            if prefix != Path("/"):  # the preload file names the final path, not the staging one
                done.preload_path.write_text(f"{final}\n")
        except OSError as exc:
            raise HamiError(f"hami host install: cannot write under {root}: {exc}") from None
        installed.append(
            HostLibrary(
                vendor.name, vendor.version, _final(done.build_path, prefix), final, _final(done.preload_path, prefix)
            )
        )
    return installed


def cdi_spec(library: HostLibrary) -> dict[str, Any]:
    """The CDI specification giving a container `library` (see the module's doc)."""
    options = ["ro", "nosuid", "nodev", "bind"]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": f"hami.io/{library.vendor}",
        "devices": [
            {
                "name": "isolation",
                "containerEdits": {
                    "mounts": [
                        {"hostPath": library.path, "containerPath": library.path, "options": options},
                        {"hostPath": library.preload, "containerPath": "/etc/ld.so.preload", "options": options},
                    ]
                },
            }
        ],
    }


def write_cdi(libraries: Sequence[HostLibrary], prefix: Path) -> list[Path]:
    """Write each library's CDI specification under `prefix`; the files written."""
    directory = prefix / CDI_DIR.lstrip("/")
    written = []
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        for library in libraries:
            path = directory / f"hami-{library.vendor}.json"
            temporary = path.with_name(f".{path.name}.tmp")
            temporary.write_text(json.dumps(cdi_spec(library), indent=2) + "\n")
            temporary.chmod(0o644)
            os.replace(temporary, path)
            written.append(path)
    except OSError as exc:
        raise HamiError(f"hami host install: cannot write the CDI specifications under {directory}: {exc}") from None
    return written


def render_install(libraries: Sequence[HostLibrary], written: Sequence[Path]) -> str:
    """What ``hami host install`` prints: per vendor its paths and the configuration that uses them."""
    if not libraries:
        return "no loaded vendor ships an isolation library (hami vendors lists them)\n"
    lines = []
    for lib in libraries:
        lines += [
            f"{lib.vendor} {lib.version}",
            f"  library     {lib.path} -> {Path(lib.build).name}",
            f"  preload     {lib.preload}",
            f"  CDI         --device hami.io/{lib.vendor}=isolation  ({CDI_DIR}/hami-{lib.vendor}.json)",
            f"  docker run  -v {lib.path}:{lib.path}:ro -v {lib.preload}:/etc/ld.so.preload:ro",
            f"  host agent  the library path option = {lib.path}  (Cloudpods: docs/host.md)",
            "",
        ]
    if written:
        lines.append("wrote " + ", ".join(str(p) for p in written))
    else:
        lines.append("(--write also writes the CDI specifications)")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- status


def status(state_dir: Path) -> list[dict[str, Any]]:
    """Every recorded run with its accounting file's figures (see the module's doc), by name."""
    runs = []
    for record_path in sorted((state_dir / "runs").glob("*.json")):
        try:
            record = json.loads(record_path.read_text())
        except (OSError, ValueError) as exc:
            runs.append({"name": record_path.stem, "error": f"{record_path}: {exc}"})
            continue
        entry: dict[str, Any] = {k: record.get(k) for k in ("name", "vendor", "user", "shared", "accounting_file")}
        entry["devices"] = []
        try:
            account = accounting.read_accounting(record["accounting_file"])
        except FileNotFoundError:
            account = None
            entry["note"] = "no process has used the device yet"
        except (OSError, accounting.AccountingFileError, KeyError) as exc:
            account = None
            entry["error"] = str(exc)
        for i, device in enumerate(record.get("devices") or []):
            shown = {
                "index": device.get("index"),
                "uuid": device.get("uuid"),
                "granted_mib": device.get("memory_mib"),
                "cores": device.get("cores"),
            }
            if account is not None and i < len(account.devices):
                d = account.device(i)
                shown |= {
                    "used_bytes": d.memory_used,
                    "limit_bytes": d.memory_limit,
                    "peak_bytes": d.memory_peak,
                    "core_limit": d.core_limit,
                    "launches": d.launches,
                }
            entry["devices"].append(shown)
        entry["processes"] = [p.pid for p in account.processes] if account is not None else []
        runs.append(entry)
    return runs


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / (1 << 20):.0f}"


def render_status(runs: Sequence[dict[str, Any]]) -> str:
    """The table ``hami host status`` prints."""
    if not runs:
        return "no grants (hami run records its runs in the state directory)\n"
    header = f"{'NAME':<24} {'VENDOR':<8} {'DEVICE':<6} {'MEMORY MiB used/limit':<22} {'PEAK':>6} {'CORES':>5} "
    lines = [header + "PROCESSES"]
    for run in runs:
        if "error" in run and not run.get("devices"):
            lines.append(f"{run['name']:<24} {run['error']}")
            continue
        for device in run.get("devices") or []:
            used = _mib(device.get("used_bytes"))
            limit = _mib(device.get("limit_bytes")) if "limit_bytes" in device else str(device.get("granted_mib"))
            processes = ",".join(map(str, run.get("processes") or [])) or "-"
            lines.append(
                f"{run['name']:<24} {run.get('vendor') or '-':<8} {device.get('index')!s:<6} "
                f"{used + '/' + limit:<22} {_mib(device.get('peak_bytes')):>6} "
                f"{device.get('cores') or 0!s:>5} {processes}"
            )
        if run.get("note") or run.get("error"):
            lines.append(f"{'':<24} {run.get('note') or run.get('error')}")
    return "\n".join(lines) + "\n"
