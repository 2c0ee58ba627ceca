"""`hami doctor` through the cluster: the API server's clock, and the node daemon's own view (`--node N`).

Owns the two things the doctor asks of the API server: its time (the ``Date`` header of ``GET /version``, which
every authenticated account may read) for the clock check, and running ``hami doctor --json`` inside the node
daemon's container on a named node (the pods' ``exec`` subresource, what ``kubectl exec`` does) so that an
operator sees what the daemon sees (its mounts, its ``/proc``, its devices) from wherever a kubeconfig works.
The daemon's pod is found by its component label and node (`daemon_pod`). It goes through the `kubernetes`
client (the exec subresource is a WebSocket upgrade the project's own transport does not speak); it changes
nothing in the cluster.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

from hami.errors import HamiError

__all__ = [
    "node_allocatable",
    "DAEMON_CONTAINER",
    "DAEMON_SELECTOR",
    "RemoteError",
    "api_client",
    "daemon_pod",
    "run_on_node",
    "server_date",
]

DAEMON_CONTAINER = "hami-node"
"""The node daemon's container in the chart's DaemonSet."""
DAEMON_SELECTOR = "app.kubernetes.io/component=node"
"""The label the chart puts on the node daemon's pods."""


class RemoteError(HamiError):
    """The node daemon's view could not be had: no such pod, or exec failed (the message says which)."""


def api_client(kubeconfig: str | None, context: str | None) -> Any:
    """A `kubernetes` client for a kubeconfig, or the pod's service account inside a pod without one.

    :raises hami.cluster.port.ClusterError: the kubeconfig cannot be loaded."""
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    from hami.cluster.kube import KubeCluster

    if kubeconfig or context or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return KubeCluster.api_client_for(kubeconfig, context)
    configuration = k8s_client.Configuration()
    k8s_config.load_incluster_config(client_configuration=configuration)
    return k8s_client.ApiClient(configuration)


def server_date(api: Any) -> Callable[[], datetime]:
    """A reader of the API server's time: the ``Date`` header of ``GET /version``."""
    from kubernetes import client as k8s_client

    def read() -> datetime:
        _, _, headers = k8s_client.VersionApi(api).get_code_with_http_info(_request_timeout=(3, 5))
        date = (headers or {}).get("Date") or (headers or {}).get("date")
        if not date:
            raise RemoteError("the API server's answer has no Date header")
        return parsedate_to_datetime(date)

    return read


def node_allocatable(api: Any, node: str) -> dict[str, str] | None:
    """The Node's ``status.allocatable`` (what the kubelet took from the device plugins), or None when it cannot be
    read (no such Node, no permission, no API server): the registration check then reads the kubelet's checkpoint."""
    from kubernetes import client as k8s_client

    try:
        status = k8s_client.CoreV1Api(api).read_node(node, _request_timeout=(3, 5)).status
    except Exception:  # any failure means: ask the checkpoint instead
        return None
    return {str(k): str(v) for k, v in (status.allocatable or {}).items()}


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
    from kubernetes import client as k8s_client
    from kubernetes.client.rest import ApiException
    from kubernetes.stream import stream

    core = k8s_client.CoreV1Api(api)
    try:
        listed = core.list_pod_for_all_namespaces(
            label_selector=DAEMON_SELECTOR, field_selector=f"spec.nodeName={node}"
        )
    except ApiException as exc:
        raise RemoteError(f"listing the node daemon's pods failed: {exc.status} {exc.reason}") from None
    pods = [api.sanitize_for_serialization(p) for p in listed.items]
    namespace, name = daemon_pod(pods, node)
    command = ["hami", "doctor", *argv]
    try:
        session = stream(
            core.connect_get_namespaced_pod_exec,
            name,
            namespace,
            container=DAEMON_CONTAINER,
            command=command,
            stdin=False,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
        )
        session.run_forever(timeout=timeout)
        out, err = session.read_stdout() or "", session.read_stderr() or ""
        status = session.returncode
        session.close()
    except Exception as exc:  # ApiException, the WebSocket client's own errors, OSError: all say the exec failed
        reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise RemoteError(
            f"exec in {namespace}/{name} failed: {reason} (your account needs pods/exec there, and the API server "
            "must reach the node's kubelet)"
        ) from None
    if status is None:
        raise RemoteError(f"hami doctor in {namespace}/{name} did not finish within {timeout:.0f} s")
    return int(status), out, err


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
