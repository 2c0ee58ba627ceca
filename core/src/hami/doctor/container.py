"""`hami doctor --container`: what the isolation library sees in this container, and whether children keep it.

Owns the container-side checks, each a small function returning findings:

* `grant`: the grant directory the library reads (``/etc/hami/grant``, else ``HAMI_ISOLATION_GRANT_DIR`` where
  that does not exist: GRANT.md), each ``<vendor>.grant`` in it read as the library reads it (`hami.isolation.grant
  .parse`), with its limits; a grant this process can write (not mounted read-only) is a failure;
* `preload`: ``/etc/ld.so.preload`` names an isolation library that exists and is mapped into this very process
  (``/proc/self/maps``); a library carried only by ``LD_PRELOAD`` is a warning;
* `children`: a child started with an empty environment (what ``sudo``'s env_reset, ``su -`` and an SSH daemon's
  sessions give: HAMi issues #1112 and #2125) still maps the library, and its limits come from the grant file,
  which no environment can drop;
* then each vendor's `hami_doctor_checks` with its grant (the memory its tool reports against the limit).

Nothing here changes the container. The paths are parameters so tests can point them at a sandbox.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hami.findings import Finding, failed, ok, probe, warning
from hami.isolation.grant import GRANT_DIR, Grant, GrantError, parse
from hami.plugins import VendorPlugins

__all__ = ["ContainerView", "children", "container_findings", "grant", "preload"]

GRANT_ENV = "HAMI_ISOLATION_GRANT_DIR"
_MAX_GRANT = 8192


@dataclass
class ContainerView:
    """Where the container's files are (the real ones unless a test says otherwise), and what was read."""

    grant_dir: Path = Path(GRANT_DIR)
    preload_file: Path = Path("/etc/ld.so.preload")
    maps: Path = Path("/proc/self/maps")
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    grants: dict[str, Grant] = field(default_factory=dict)
    """Vendor name → its grant, filled by `grant`."""

    def effective_grant_dir(self) -> Path | None:
        if self.grant_dir.exists():
            return self.grant_dir
        configured = self.environ.get(GRANT_ENV, "").strip()
        return Path(configured) if configured else None


def _limits(g: Grant) -> str:
    devices = [
        f"device {i}: {d.memory_bytes >> 20 if d.memory_bytes else 'whole'}"
        f"{' MiB' if d.memory_bytes else ''}, {d.cores if d.cores not in (0, 100) else 100} % cores"
        for i, d in enumerate(g.devices)
    ]
    return "; ".join(devices) + f"; policy {g.policy}, priority {g.priority}"


def grant(view: ContainerView) -> list[Finding]:
    check = "grant"
    directory = view.effective_grant_dir()
    if directory is None:
        return [
            warning(
                check,
                f"no {view.grant_dir} and no {GRANT_ENV}: the limits come from the environment alone",
                "a child that drops its environment (sudo, su -, ssh) runs unlimited: give the container through the "
                "node daemon, which mounts a grant",
            )
        ]
    try:
        files = sorted(p for p in directory.iterdir() if p.name.endswith(".grant"))
    except OSError as exc:
        return [
            failed(
                check,
                f"{directory}: {exc.strerror}: the library refuses every device allocation",
                "the grant directory must be readable by the container's user",
            )
        ]
    if not files:
        return [
            failed(
                check,
                f"no <vendor>.grant in {directory}: the library refuses every device allocation",
                "restart the pod (the node daemon writes the grant at Allocate)",
            )
        ]
    findings = []
    for path in files:
        vendor = path.name[: -len(".grant")]
        try:
            with path.open("rb") as f:
                raw = f.read(_MAX_GRANT + 1)
            if len(raw) > _MAX_GRANT:
                raise GrantError(f"longer than {_MAX_GRANT} bytes")
            parsed = parse(raw.decode("ascii"))
        except (OSError, UnicodeDecodeError, GrantError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            findings.append(
                failed(
                    f"{check} {vendor}",
                    f"{path}: {reason}: the library refuses every device allocation",
                    "restart the pod so the node daemon writes its grant again",
                )
            )
            continue
        view.grants[vendor] = parsed
        if os.access(path, os.W_OK) or os.access(directory, os.W_OK):
            findings.append(
                failed(
                    f"{check} {vendor}",
                    f"{path} is writable from this container: a process can raise its own limits",
                    "mount the grant directory read-only (the node daemon does)",
                )
            )
        else:
            findings.append(ok(f"{check} {vendor}", f"{path}, read-only: {_limits(parsed)}"))
    return findings


def _mapped(maps: Path, library: Path) -> bool:
    try:
        text = maps.read_text()
    except OSError:
        return False
    names = {str(library)}
    with contextlib.suppress(OSError):
        names.add(str(library.resolve()))
    return any(line.rsplit(" ", 1)[-1] in names for line in text.splitlines())


def _preloaded(view: ContainerView) -> tuple[list[Path], str]:
    """The libraries /etc/ld.so.preload names, and where they came from."""
    try:
        words = view.preload_file.read_text().split()
    except OSError:
        words = []
    if words:
        return [Path(w) for w in words], str(view.preload_file)
    carried = view.environ.get("LD_PRELOAD", "").replace(":", " ").split()
    return [Path(w) for w in carried], "LD_PRELOAD"


def preload(view: ContainerView) -> Finding:
    check = "isolation library"
    libraries, source = _preloaded(view)
    if not libraries:
        return failed(
            check,
            f"{view.preload_file} names no library and LD_PRELOAD is unset: nothing limits this container's device use",
            "the container was not given through the node daemon, or asked "
            "for whole devices without control (CUDA_DISABLE_CONTROL)",
        )
    missing = [str(p) for p in libraries if not p.exists()]
    if missing:
        return failed(
            check,
            f"{source} names {', '.join(missing)}, which is not in this container",
            "restart the pod: the node daemon mounts the library at the path the preload file names",
        )
    loaded = [str(p) for p in libraries if _mapped(view.maps, p)]
    if not loaded:
        return failed(
            check,
            f"{source} names {', '.join(map(str, libraries))}, but this process did not load it",
            "a statically linked or setuid program skips LD_PRELOAD; check the loader's message with LD_DEBUG=libs",
        )
    if source == "LD_PRELOAD":
        return warning(
            check,
            f"{', '.join(loaded)} loaded through LD_PRELOAD only",
            "a child that clears its "
            "environment runs without it: mount a preload file at /etc/ld.so.preload (the node daemon "
            "does)",
        )
    return ok(check, f"{', '.join(loaded)} loaded through {source}")


def _child_maps(environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The memory map of a child started with `environ` (cat reading its own /proc/self/maps), or why not."""
    cat = shutil.which("cat") or "/bin/cat"
    try:
        done = subprocess.run(
            [cat, "/proc/self/maps"], env=dict(environ), capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if done.returncode != 0:
        return None, done.stderr.strip() or f"exit status {done.returncode}"
    return done.stdout, ""


def children(view: ContainerView) -> Finding:
    """A child with an empty environment, as sudo (env_reset), `su -` and an SSH session start it."""
    check = "children through su/sudo/ssh"
    libraries, source = _preloaded(view)
    if not libraries:
        return warning(check, "no isolation library to keep", "see the isolation library finding")
    maps, why = _child_maps({})
    if maps is None:
        return warning(
            check,
            f"could not start a child to look: {why}",
            "run `env -i cat /proc/self/maps` in the container and look for the library",
        )
    names = {str(p) for p in libraries} | {str(p.resolve()) for p in libraries if p.exists()}
    kept = any(line.rsplit(" ", 1)[-1] in names for line in maps.splitlines())
    if not kept:
        return failed(
            check,
            f"a child with an empty environment does not load {', '.join(map(str, libraries))} (carried by {source})",
            "mount a preload file at /etc/ld.so.preload naming the library (the node daemon does): the loader reads "
            "it for every program, whatever its environment; LD_PRELOAD does not survive sudo, su - or ssh",
        )
    if not view.grants:
        return warning(
            check,
            "a child with an empty environment loads the library, but there is no grant: its "
            "limits came from variables it no longer has",
            "give the container through the node daemon, "
            "which mounts a grant (the library reads it whatever the environment)",
        )
    return ok(check, "a child with an empty environment (sudo, su -, ssh) loads the library and reads the same grant")


def container_findings(plugins: VendorPlugins, view: ContainerView | None = None) -> list[Finding]:
    """Every check of `hami doctor --container`: core's, then each vendor that has a grant here."""
    view = view or ContainerView()
    findings: list[Finding] = []
    findings += probe("grant", lambda: grant(view))
    findings += probe("isolation library", lambda: preload(view))
    findings += probe("children through su/sudo/ssh", lambda: children(view))
    findings += plugins.doctor_checks(view.grants.get)
    return findings
