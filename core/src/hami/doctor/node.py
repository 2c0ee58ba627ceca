"""`hami doctor` on a node: core's checks of what the node daemon depends on, beside each vendor's own.

Owns the node-side checks that belong to no vendor, each a small function returning findings:

* `kubelet_socket`: ``kubelet.sock`` in the device-plugin directory exists and accepts a connection;
* `registration`: the daemon's plugin sockets (``hami-<resource>.sock``) accept connections, and the kubelet's
  checkpoint (``kubelet_internal_checkpoint``) lists their resources;
* `hook_directory`: the host directory of the installed isolation libraries is root's and no one else's;
* `preload_files`: each installed ``ld.so.preload`` (what containers get at ``/etc/ld.so.preload``) names one
  library that exists, is root's and loads (a child started with it as ``LD_PRELOAD`` gets no loader error);
  and the host's own ``/etc/ld.so.preload`` does not name one (every process of the host would load it);
* `cgroup_layout`: the backstop's mapping from a process to its pod (``/proc/<pid>/cgroup``) finds pods among the
  host's processes, which also shows the daemon sees the host's pid namespace;
* `placement_key`: the key directory ``HAMI_PLACEMENT_KEYS`` names is readable;
* `clock`: the node's clock against the API server's ``Date`` (node locks and handshakes compare times);
* `node_lock`: the node lock the daemon offers as a Lease (`hami.cluster.nodelease`): the offer on the Node, the
  Lease it names, owned by the daemon's pod.

`node_findings` runs them with every vendor's `hami_doctor_checks` (through `VendorPlugins.doctor_checks`). Nothing
here writes anything; a check that cannot look (no permission, no cluster) says so as its finding.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hami.findings import Finding, failed, ok, probe, warning
from hami.node.backstop import owner_of
from hami.node.kubelet import KUBELET_SOCKET
from hami.plugins import VendorPlugins
from hami.signing import KEYS_ENVIRONMENT, PlacementKeys

__all__ = [
    "CHECKPOINT",
    "SKEW_FAILED_SECONDS",
    "SKEW_WARNING_SECONDS",
    "cgroup_layout",
    "clock",
    "hook_directory",
    "kubelet_socket",
    "node_findings",
    "placement_key",
    "preload_files",
    "registration",
]

CHECKPOINT = "kubelet_internal_checkpoint"
"""The kubelet's device-manager checkpoint in the device-plugin directory: the resources it has registered."""
SKEW_WARNING_SECONDS = 5.0
SKEW_FAILED_SECONDS = 30.0
_PLUGIN_PREFIX, _PLUGIN_SUFFIX = "hami-", ".sock"


def _connects(path: Path, timeout: float = 2.0) -> str | None:
    """None when a unix socket at `path` accepts a connection, else why not."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(str(path))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def kubelet_socket(plugin_dir: Path) -> Finding:
    check = "kubelet socket"
    path = plugin_dir / KUBELET_SOCKET
    if not plugin_dir.is_dir():
        return failed(
            check,
            f"{plugin_dir} does not exist here",
            "mount the kubelet's device-plugin directory into "
            "the node daemon (the chart's devicePlugin.pluginPath: <kubelet root-dir>/device-plugins)",
        )
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return failed(
            check,
            f"no {path}",
            "check that the kubelet runs and that pluginPath is its root-dir's "
            "device-plugins directory (kubelet --root-dir)",
        )
    except OSError as exc:
        return failed(check, f"{path}: {exc.strerror}", "run hami doctor as root (as the node daemon runs)")
    if not stat.S_ISSOCK(mode):
        return failed(check, f"{path} is not a socket", "remove the file: the kubelet makes its socket at start")
    refused = _connects(path)
    if refused:
        return failed(check, f"{path} refuses connections ({refused})", "restart the kubelet")
    return ok(check, f"{path} accepts connections")


def _resource_of(socket_name: str) -> str:
    return socket_name[len(_PLUGIN_PREFIX) : -len(_PLUGIN_SUFFIX)].replace("_", "/", 1)


def _registered(plugin_dir: Path) -> set[str] | str:
    """The resources in the kubelet's checkpoint, or why they cannot be read."""
    try:
        data = json.loads((plugin_dir / CHECKPOINT).read_text())
    except FileNotFoundError:
        return f"no {plugin_dir / CHECKPOINT}"
    except (OSError, ValueError) as exc:
        return f"{plugin_dir / CHECKPOINT} cannot be read: {exc}"
    devices = (data.get("Data") or {}).get("RegisteredDevices") if isinstance(data, dict) else None
    if not isinstance(devices, dict):
        return f"{plugin_dir / CHECKPOINT} has no Data.RegisteredDevices"
    return set(devices)


def registration(plugin_dir: Path, allocatable: Mapping[str, str] | None = None) -> list[Finding]:
    """Each plugin socket of the daemon accepts connections, and its resource is registered: on the Node's
    allocatable where the API server could be read (`allocatable`), else in the kubelet's checkpoint."""
    check = "device plugin registration"
    try:
        sockets = sorted(
            p for p in plugin_dir.iterdir() if p.name.startswith(_PLUGIN_PREFIX) and p.name.endswith(_PLUGIN_SUFFIX)
        )
    except OSError as exc:
        return [failed(check, f"{plugin_dir}: {exc.strerror}", "mount the kubelet's device-plugin directory")]
    if not sockets:
        return [
            failed(
                check,
                f"no hami-*.sock in {plugin_dir}: the node daemon serves no resource here",
                "check that the node daemon runs on this node and found devices (its log says what each vendor "
                "discovered)",
            )
        ]
    registered = _registered(plugin_dir) if allocatable is None else set(allocatable)
    return [_registration(f"{check} {_resource_of(p.name)}", p, registered, allocatable) for p in sockets]


def _registration(check: str, path: Path, registered: set[str] | str, allocatable: Mapping[str, str] | None) -> Finding:
    resource = _resource_of(path.name)
    refused = _connects(path)
    if refused:
        return failed(check, f"{path} refuses connections ({refused})", "restart the node daemon (its socket is stale)")
    if isinstance(registered, str):
        return warning(check, f"{path} is served; {registered}", f"check the kubelet's log for {resource}")
    where = "the Node's allocatable" if allocatable is not None else "the kubelet's checkpoint"
    if resource not in registered:
        return failed(
            check,
            f"{path} is served, but {where} lists no {resource}",
            "restart the node daemon so it registers again, and read the kubelet's log for why it refused",
        )
    if allocatable is not None and allocatable.get(resource) in ("0", ""):
        fix = "every device of it is unhealthy or none was found: the daemon's log and the vendor's checks say which"
        return warning(check, f"registered, but the Node's allocatable {resource} is 0", fix)
    count = f" ({allocatable[resource]} allocatable)" if allocatable is not None else ""
    return ok(check, f"served on {path.name} and registered with the kubelet{count}")


def _owned_by_root_only(path: Path, st: os.stat_result, owner: int) -> str | None:
    if st.st_uid != owner:
        return f"{path} is owned by uid {st.st_uid}, not {owner}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def hook_directory(hook_dir: Path, *, owner: int = 0) -> Finding:
    check = "hook directory"
    try:
        st = hook_dir.stat()
    except FileNotFoundError:
        return failed(
            check,
            f"no {hook_dir}",
            "mount the host's hook directory into the node daemon (the chart's "
            "devicePlugin.hookPath); the daemon installs the isolation libraries there at start",
        )
    except OSError as exc:
        return failed(check, f"{hook_dir}: {exc.strerror}", "run hami doctor as root (as the node daemon runs)")
    problem = _owned_by_root_only(hook_dir, st, owner)
    if problem:
        return failed(
            check, problem, f"chown root:root {hook_dir} and chmod go-w {hook_dir}: containers mount libraries from it"
        )
    return ok(check, f"{hook_dir}: root's, writable by no one else")


def _loads(library: Path, timeout: float = 10.0) -> str | None:
    """None when a child started with `library` preloaded runs without a loader error; else the loader's message."""
    true = next((p for p in ("/bin/true", "/usr/bin/true") if os.path.exists(p)), None)
    if true is None:
        return None  # nothing to start: the image has no true(1); the other checks stand
    try:
        done = subprocess.run(
            [true], env={"LD_PRELOAD": str(library)}, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    message = done.stderr.strip()
    if done.returncode != 0 or "ld.so" in message or "cannot be preloaded" in message:
        return message.splitlines()[0] if message else f"exit status {done.returncode}"
    return None


def preload_files(plugins: VendorPlugins, hook_dir: Path, *, etc: Path = Path("/etc"), owner: int = 0) -> list[Finding]:
    findings = []
    if not hook_dir.is_dir():  # the hook directory's own finding says so; one per vendor would repeat it
        return [_host_preload(plugins, etc / "ld.so.preload")]
    for vendor in plugins.vendors:
        if not vendor.info.isolation_library:
            continue
        check = "ld.so.preload for containers"
        preload = hook_dir / vendor.name / "ld.so.preload"
        try:
            text = preload.read_text()
            st = preload.stat()
        except FileNotFoundError:
            findings.append(
                _vendor(
                    warning(
                        check,
                        f"no {preload}",
                        "start the node daemon: it installs the library "
                        "and its preload file at start (its log says why it could not)",
                    ),
                    vendor.name,
                )
            )
            continue
        except OSError as exc:
            findings.append(
                _vendor(failed(check, f"{preload}: {exc.strerror}", "run hami doctor as root"), vendor.name)
            )
            continue
        named = [w for w in text.split() if w]
        problem = _owned_by_root_only(preload, st, owner)
        if len(named) != 1:
            problem = f"{preload} names {len(named)} libraries, not one"
        library = Path(named[0]) if len(named) == 1 else None
        if problem is None and library is not None:
            problem = _library_problem(library, owner)
        if problem is None and library is not None:
            refused = _loads(library)
            problem = f"{library} does not load: {refused}" if refused else None
        if problem:
            findings.append(
                _vendor(
                    failed(
                        check,
                        problem,
                        "restart the node daemon to install the library again; "
                        "a container started now runs without its limits",
                    ),
                    vendor.name,
                )
            )
        else:
            findings.append(_vendor(ok(check, f"{preload} -> {library}, root's, loads"), vendor.name))
    findings.append(_host_preload(plugins, etc / "ld.so.preload"))
    return findings


def _library_problem(library: Path, owner: int) -> str | None:
    try:
        st = library.stat()
        with library.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        return f"{library}: {exc.strerror}"
    if magic != b"\x7fELF":
        return f"{library} is not a shared library (no ELF header)"
    return _owned_by_root_only(library, st, owner)


def _host_preload(plugins: VendorPlugins, path: Path) -> Finding:
    check = "host /etc/ld.so.preload"
    try:
        words = path.read_text().split()
    except FileNotFoundError:
        return ok(check, f"{path} absent: host processes load no isolation library")
    except OSError as exc:
        return warning(check, f"{path}: {exc.strerror}", "run hami doctor as root")
    names = {v.info.isolation_library for v in plugins.vendors if v.info.isolation_library}
    ours = [w for w in words if Path(w).name in names]
    if ours:
        return warning(
            check,
            f"{path} names {', '.join(ours)}: every process of the host loads it",
            "remove it from the host's file: containers get their own /etc/ld.so.preload from the node daemon",
        )
    return ok(check, f"{path} names no isolation library")


def _vendor(finding: Finding, name: str) -> Finding:
    return Finding(finding.check, finding.status, finding.detail, finding.fix, name)


def cgroup_layout(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> Finding:
    """What the backstop maps processes through: how many of the visible processes `owner_of` places in a pod."""
    check = "cgroup layout"
    version = "v2" if (cgroup_root / "cgroup.controllers").exists() else "v1"
    pids = [int(p.name) for p in proc.iterdir() if p.name.isdigit()]
    pods: set[str] = set()
    mapped = 0
    for pid in pids:
        owner = owner_of(pid, proc)
        if owner is not None:
            mapped += 1
            pods.add(owner[0])
    if not pids:
        return failed(check, f"no process visible in {proc}", "mount the host's /proc (the backstop's procRoot)")
    own = owner_of(1, proc)
    if own is not None:
        return failed(
            check,
            f"process 1 is in pod {own[0]}: this is a container's pid namespace, the backstop sees no other pod",
            "run the node daemon with hostPID: true (the chart does)",
        )
    if not _has_nspid(proc, pids):
        return warning(
            check,
            "no NSpid in /proc/<pid>/status (kernel before 4.1)",
            "the isolation library cannot learn its host pid: upgrade the kernel for per-process utilization",
        )
    if not pods:
        sample = _first_cgroup_line(proc, pids)
        return warning(
            check,
            f"cgroup {version}; none of {len(pids)} processes is in a pod's cgroup (e.g. {sample!r})",
            "no pod runs here yet, or the kubelet names cgroups in a way the backstop does not read "
            "(it looks for pod<uid> in /proc/<pid>/cgroup): report the line above",
        )
    return ok(check, f"cgroup {version}; {mapped} of {len(pids)} processes mapped to {len(pods)} pod(s)")


def _has_nspid(proc: Path, pids: Sequence[int]) -> bool:
    """Whether the kernel writes ``NSpid:`` in /proc/<pid>/status (4.1 and later), as far as a status can be read."""
    for pid in pids:
        try:
            return "\nNSpid:" in (proc / str(pid) / "status").read_text()
        except OSError:
            continue
    return True  # nothing readable: the other checks say why


def _first_cgroup_line(proc: Path, pids: Sequence[int]) -> str:
    for pid in pids:
        try:
            return (proc / str(pid) / "cgroup").read_text().splitlines()[0]
        except (OSError, IndexError):
            continue
    return ""


def placement_key(environ: dict[str, str] | None = None) -> Finding:
    check = "placement key"
    env = dict(os.environ) if environ is None else environ
    if not env.get(KEYS_ENVIRONMENT, "").strip():
        return warning(
            check,
            f"{KEYS_ENVIRONMENT} is not set: placements are not signed",
            "enable the chart's placementSigning, or anyone who may patch pods can rewrite what they are given",
        )
    try:
        keys = PlacementKeys.from_environment(env)
    except Exception as exc:  # SignatureError and OSError both name the file
        return failed(check, str(exc), "mount the placement-key Secret where HAMI_PLACEMENT_KEYS says")
    return ok(check, f"read from {keys.source if keys else env[KEYS_ENVIRONMENT]}")


def clock(server_date: Callable[[], datetime] | None, now: Callable[[], datetime] | None = None) -> Finding:
    """The node's clock against the API server's (its ``Date`` header, whole seconds): locks and handshakes compare
    times written by different machines."""
    check = "clock"
    if server_date is None:
        return warning(check, "no cluster to compare with", "pass --kubeconfig, or run inside the node daemon's pod")
    clock_now = now or (lambda: datetime.now(UTC))
    before = clock_now()
    try:
        server = server_date()
    except Exception as exc:
        return warning(
            check,
            f"the API server's time could not be read: {exc}",
            "check that this node reaches the API server (the node daemon cannot work without it)",
        )
    after = clock_now()
    local = before + (after - before) / 2
    skew = (local - server).total_seconds()
    slack = 1.0 + (after - before).total_seconds() / 2  # the header has whole seconds
    detail = f"{abs(skew):.1f} s {'ahead of' if skew > 0 else 'behind'} the API server"
    if abs(skew) > SKEW_FAILED_SECONDS + slack:
        return failed(
            check,
            detail,
            "synchronize the node's clock (chrony or systemd-timesyncd): node locks expire "
            "by time and handshakes time out",
        )
    if abs(skew) > SKEW_WARNING_SECONDS + slack:
        return warning(check, detail, "synchronize the node's clock (chrony or systemd-timesyncd)")
    return ok(check, detail)


LockLeaseReader = Callable[[], tuple[str | None, Mapping[str, Any] | None]]
"""Reads the node's `hami.io/node-lock-lease` offer and the Lease it names (None when absent)."""


def node_lock(read: LockLeaseReader | None) -> Finding:
    """Whether the node's daemon offers its lock as a Lease (no Node write per placed pod) and the Lease is there,
    owned by the daemon's pod (so that it goes with the daemon)."""
    check = "node lock"
    if read is None:
        return warning(check, "no cluster to read the node from", "pass --kubeconfig, or run inside the daemon's pod")
    try:
        offer, lease = read()
    except Exception as exc:
        return warning(
            check, f"the node's lock could not be read: {exc}", "check the daemon's RBAC for nodes and leases"
        )
    if not offer:
        return warning(
            check,
            "the node offers no lock Lease: each placed pod writes the Node object twice (hami.io/mutex.lock)",
            "run the daemon with node.lockLease (the default) and POD_NAMESPACE from the downward API, as the chart "
            "does; a daemon whose Lease the API refuses says why in its log",
        )
    if lease is None:
        return warning(
            check,
            f"the node offers Lease {offer}, which does not exist: binds lock the node annotation until the daemon "
            "creates it again (at its next node sync)",
            "if it stays absent, check the daemon's RBAC: get, create and update leases in its namespace",
        )
    owners = (lease.get("metadata") or {}).get("ownerReferences") or []
    pods = [o.get("name") for o in owners if isinstance(o, Mapping) and o.get("kind") == "Pod"]
    holder = (lease.get("spec") or {}).get("holderIdentity") or "nobody"
    if not pods:
        return warning(
            check,
            f"Lease {offer} is owned by no pod: it outlives the daemon, and a bind would keep locking it if HAMi's "
            "daemon replaced this one",
            "set POD_NAME and POD_UID from the downward API, as the chart does",
        )
    return ok(check, f"Lease {offer}, owned by pod {pods[0]}, last taken by {holder}")


def node_findings(
    plugins: VendorPlugins,
    plugin_dir: Path,
    hook_dir: Path,
    server_date: Callable[[], datetime] | None,
    *,
    proc: Path = Path("/proc"),
    etc: Path = Path("/etc"),
    owner: int = 0,
    allocatable: Mapping[str, str] | None = None,
    lock_lease: LockLeaseReader | None = None,
) -> list[Finding]:
    """Every check of `hami doctor` on a node: core's, then each vendor's. `owner` is who must own the host
    directories (root; tests pass their own uid); `allocatable` is the Node's, where the API server could be read."""
    findings: list[Finding] = []
    findings += probe("kubelet socket", lambda: kubelet_socket(plugin_dir))
    findings += probe("device plugin registration", lambda: registration(plugin_dir, allocatable))
    findings += probe("hook directory", lambda: hook_directory(hook_dir, owner=owner))
    findings += probe("ld.so.preload for containers", lambda: preload_files(plugins, hook_dir, etc=etc, owner=owner))
    findings += probe("cgroup layout", lambda: cgroup_layout(proc))
    findings += probe("placement key", placement_key)
    findings += probe("clock", lambda: clock(server_date))
    findings += probe("node lock", lambda: node_lock(lock_lease))
    findings += plugins.doctor_checks(None)
    return findings
