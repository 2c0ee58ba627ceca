"""What operators' tools ask of a real API server beyond the port's verbs: a client for a kubeconfig (or the pod's
service account), the server's clock, a Node's allocatable and its lock offer, the pods by selector, and an exec in a
pod's container.

Used by `hami doctor` (its clock check and `--node`), never by the services: they speak the port
(`hami.cluster.port`). Owns its use of the `kubernetes` client, which stays inside `hami.cluster` (import-linter
holds it), imported only when a function here runs. Errors come out as the port's `ClusterError`, with what to do.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

from hami.cluster.port import ClusterError

__all__ = ["api_client", "exec_in_pod", "list_pods", "node_allocatable", "node_lock_lease", "server_date"]


def api_client(kubeconfig: str | None, context: str | None) -> Any:
    """A `kubernetes` client for a kubeconfig, or the pod's service account inside a pod without one.

    :raises ClusterError: the kubeconfig cannot be loaded."""
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    from hami.cluster.kube_transport import kubeconfig_api_client

    if kubeconfig or context or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return kubeconfig_api_client(kubeconfig, context)
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
            raise ClusterError("the API server's answer has no Date header")
        return parsedate_to_datetime(date)

    return read


def node_allocatable(api: Any, node: str) -> dict[str, str] | None:
    """The Node's ``status.allocatable`` (what the kubelet took from the device plugins), or None when it cannot be
    read (no such Node, no permission, no API server)."""
    from kubernetes import client as k8s_client

    try:
        status = k8s_client.CoreV1Api(api).read_node(node, _request_timeout=(3, 5)).status
    except Exception:  # any failure means: the caller asks another source
        return None
    return {str(k): str(v) for k, v in ((status.allocatable if status else None) or {}).items()}


def node_lock_lease(api: Any, node: str) -> Callable[[], tuple[str | None, dict[str, Any] | None]]:
    """A reader of the node's lock offer (`hami.io/node-lock-lease`) and the Lease it names (None when absent).

    The reader raises `ClusterError` when the Node or the Lease cannot be read (no permission, no API server)."""
    from kubernetes import client as k8s_client
    from kubernetes.client.rest import ApiException

    from hami.cluster.nodelease import LEASE_ANNOTATION, lease_ref

    def read() -> tuple[str | None, dict[str, Any] | None]:
        offer: str | None = None
        try:
            metadata = k8s_client.CoreV1Api(api).read_node(node, _request_timeout=(3, 5)).metadata
            annotations = (metadata.annotations if metadata else None) or {}
            offer = annotations.get(LEASE_ANNOTATION)
            ref = lease_ref(annotations)
            if ref is None:
                return offer, None
            lease = k8s_client.CoordinationV1Api(api).read_namespaced_lease(ref[1], ref[0], _request_timeout=(3, 5))
        except ApiException as exc:
            if exc.status == 404 and offer:
                return offer, None
            raise ClusterError(f"reading node {node}'s lock: {exc.status} {exc.reason}", exc.status or 0) from None
        found: dict[str, Any] = api.sanitize_for_serialization(lease)
        return offer, found

    return read


def list_pods(api: Any, label_selector: str, field_selector: str) -> list[dict[str, Any]]:
    """Every pod matching both selectors, in all namespaces, as plain API objects.

    :raises ClusterError: the list was refused or failed."""
    from kubernetes import client as k8s_client
    from kubernetes.client.rest import ApiException

    try:
        listed = k8s_client.CoreV1Api(api).list_pod_for_all_namespaces(
            label_selector=label_selector, field_selector=field_selector
        )
    except ApiException as exc:
        raise ClusterError(f"listing pods failed: {exc.status} {exc.reason}", int(exc.status or 0)) from None
    return [api.sanitize_for_serialization(p) for p in listed.items]


def exec_in_pod(
    api: Any, namespace: str, name: str, container: str, command: Sequence[str], timeout: float
) -> tuple[int | None, str, str]:
    """Run `command` in a pod's container as `kubectl exec` does: (exit status or None if unfinished within
    `timeout`, stdout, stderr).

    :raises ClusterError: the exec could not be made, saying what the account and the API server need."""
    from kubernetes import client as k8s_client
    from kubernetes.stream import stream

    try:
        session = stream(
            k8s_client.CoreV1Api(api).connect_get_namespaced_pod_exec,
            name,
            namespace,
            container=container,
            command=list(command),
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
        raise ClusterError(
            f"exec in {namespace}/{name} failed: {reason} (your account needs pods/exec there, and the API server "
            "must reach the node's kubelet)"
        ) from None
    return (None if status is None else int(status)), out, err
