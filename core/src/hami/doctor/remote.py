"""`hami doctor` through the cluster: the API server's clock, and the node daemon's own view (`--node N`).

Owns the two things the doctor asks of the API server: its time (the ``Date`` header of ``GET /version``, which
every authenticated account may read) for the clock check, and running ``hami doctor --json`` inside the node
daemon's container on a named node (the pods' ``exec`` subresource, what ``kubectl exec`` does) so that an
operator sees what the daemon sees (its mounts, its ``/proc``, its devices) from wherever a kubeconfig works.
The daemon's pod is found by its component label and node (`daemon_pod`). The API calls themselves are
`hami.cluster.kube_tools`' (the `kubernetes` client stays in the cluster port: the exec subresource is a WebSocket
upgrade the project's own transport does not speak); it changes nothing in the cluster.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hami.cluster import kube_tools
from hami.cluster.port import ClusterError
from hami.errors import HamiError

__all__ = [
    "DAEMON_CONTAINER",
    "DAEMON_SELECTOR",
    "RemoteError",
    "daemon_pod",
    "run_on_node",
]

DAEMON_CONTAINER = "hami-node"
"""The node daemon's container in the chart's DaemonSet."""
DAEMON_SELECTOR = "app.kubernetes.io/component=node"
"""The label the chart puts on the node daemon's pods."""


class RemoteError(HamiError):
    """The node daemon's view could not be had: no such pod, or exec failed (the message says which)."""


def daemon_pod(pods: Sequence[Mapping[str, Any]], node: str) -> tuple[str, str]:
    """(namespace, name) of the running node daemon pod on `node` among `pods` (the node daemon's, by label).

    :raises RemoteError: none runs there, saying what was found."""
    here = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node]
    with_daemon = [
        p for p in here if any(c.get("name") == DAEMON_CONTAINER for c in (p.get("spec") or {}).get("containers", []))
    ]
    running = [p for p in with_daemon if (p.get("status") or {}).get("phase") == "Running"]
    if not running:
        seen = ", ".join(f"{p['metadata'].get('name')} ({(p.get('status') or {}).get('phase')})" for p in with_daemon)
        raise RemoteError(
            f"no running node daemon pod on node {node!r}"
            + (f" (found {seen})" if seen else "")
            + f": check the DaemonSet (kubectl get pods -A -l {DAEMON_SELECTOR} -o wide) and the node's name"
        )
    meta = running[0]["metadata"]
    return str(meta.get("namespace")), str(meta.get("name"))


def run_on_node(api: Any, node: str, argv: Sequence[str], timeout: float = 120.0) -> tuple[int, str, str]:
    """Run `hami doctor <argv>` in the node daemon's container on `node`: (exit status, stdout, stderr).

    :raises RemoteError: the pod cannot be found or the exec cannot be made."""
    try:
        pods = kube_tools.list_pods(api, DAEMON_SELECTOR, f"spec.nodeName={node}")
    except ClusterError as exc:
        raise RemoteError(f"the node daemon's pods: {exc}") from None
    namespace, name = daemon_pod(pods, node)
    try:
        status, out, err = kube_tools.exec_in_pod(
            api, namespace, name, DAEMON_CONTAINER, ["hami", "doctor", *argv], timeout
        )
    except ClusterError as exc:
        raise RemoteError(str(exc)) from None
    if status is None:
        raise RemoteError(f"hami doctor in {namespace}/{name} did not finish within {timeout:.0f} s")
    return status, out, err


def parse_report(text: str, where: str) -> dict[str, Any]:
    """The JSON report a remote `hami doctor --json` printed. :raises RemoteError: it printed something else."""
    try:
        report = json.loads(text.strip().splitlines()[-1]) if text.strip() else None
    except ValueError:
        report = None
    if not isinstance(report, dict) or not isinstance(report.get("findings"), list):
        first = text.strip().splitlines()[0] if text.strip() else "nothing"
        raise RemoteError(f"hami doctor in {where} printed {first!r}, not its report (is the image's hami too old?)")
    return report
