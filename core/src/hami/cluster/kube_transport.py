"""How the Kubernetes backend reaches the API server: the connection, the credentials, raw JSON on the wire.

Owns one urllib3 connection pool (TLS, client certificates, proxy, keep-alive) and the headers each request carries,
from one of two places: inside a pod, the service account the kubelet mounts (`Transport.in_cluster`: the API
server's service address from the environment, its certificate verified against the account's CA, the token re-read
as the kubelet rotates it), with no `kubernetes` client in the process (0.3-0.5 s and 13 MiB fewer at start); from a
kubeconfig, the official `kubernetes` client loads it (`kubeconfig_api_client`: every kind of credential, exec
plugins and auth providers included) and lends its pool (`Transport.from_api_client`). Also owns the translation of
what comes back: a non-2xx answer's `Status` body into `NotFoundError` / `ConflictError` / `ClusterError`
(`status_error`), a failed connection into a `ClusterError` that says what to check (`connection_error`), and whether
a failed request can have reached the server at all (`never_sent`).

Objects travel as the JSON the API serves: bodies go out as raw JSON and come back unread, never through a client
library's request layer or generated models, so field names stay camelCase and fields a client does not know
survive a read-modify-replace.

It must not retry (the backend, `hami.cluster.kube`, owns retries: one bounded loop with backoff and one log line
each, so neither this pool nor the `kubernetes` client's retries under it), know resources, paths or verbs, or
interpret an object. It must not import `kubernetes` unless a kubeconfig is loaded: a pod's process never does.
Thread-safe: the pool is shared by every caller's thread and every watch's.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import msgspec
import urllib3

from hami.cluster.port import ClusterError, ConflictError, NotFoundError

__all__ = [
    "CONNECTION_ERRORS",
    "POOL_CONNECTIONS",
    "REQUEST_TIMEOUT",
    "SERVICE_ACCOUNT",
    "TOKEN_REREAD_SECONDS",
    "HttpError",
    "Transport",
    "connection_error",
    "decode_json",
    "kubeconfig_api_client",
    "never_sent",
    "read_json",
    "status_error",
]

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = (10.0, 60.0)  # seconds to connect, seconds between bytes of a response
POOL_CONNECTIONS = 32


# ------------------------------------------------------------------------------------------ errors


class HttpError(Exception):
    """A non-2xx answer, before it becomes one of the port's errors."""

    def __init__(self, status: int, body: bytes, headers: Mapping[str, str] | None) -> None:
        self.status = status
        self.body = body
        self.headers: Mapping[str, str] = headers or {}
        super().__init__(f"HTTP {status}")


def status_error(status: int, body: bytes, what: str) -> ClusterError:
    """The port's error for an API answer: message and reason from the Status body when there is one."""
    message, reason = "", ""
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("kind") == "Status":
        message = str(parsed.get("message") or "")
        reason = str(parsed.get("reason") or "")
    if not message:
        text = body.decode("utf-8", "replace").strip()[:300]
        message = f"{what}: HTTP {status}" + (f": {text}" if text else "")
    if status == 404:
        return NotFoundError(message)
    if status == 409:
        return ConflictError(message)
    if not message.startswith(what):
        message = f"{what}: {message}"
    return ClusterError(message, status, reason)


def connection_error(exc: BaseException, host: str, what: str) -> ClusterError:
    return ClusterError(
        f"{what}: cannot reach the Kubernetes API at {host} ({exc}); check the kubeconfig, the network and that "
        "the API server is running",
        0,
        "ConnectionError",
    )


def never_sent(exc: BaseException) -> bool:
    """True when the request cannot have reached the server (the connection was never opened)."""
    reason = getattr(exc, "reason", None)
    return isinstance(exc, urllib3.exceptions.ConnectTimeoutError) or isinstance(
        reason, urllib3.exceptions.ConnectTimeoutError | ConnectionRefusedError
    )


CONNECTION_ERRORS: tuple[type[Exception], ...] = (urllib3.exceptions.HTTPError, OSError)
"""What a request that got no answer raises: the connection failed, timed out or broke."""


# ------------------------------------------------------------------------------------------ credentials


def kubeconfig_api_client(path: str | None = None, context: str | None = None) -> Any:
    """A `kubernetes.client.ApiClient` configured from the kubeconfig at `path` (default: $KUBECONFIG or
    ~/.kube/config), in `context` or the current one, through the `kubernetes` client's loader (every credential a
    kubeconfig can name): what `KubeCluster.from_kubeconfig` connects with, and what code that wants the client
    itself uses (`benchmarks/kube_client.py` compares its request path with the backend's)."""
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    configuration = k8s_client.Configuration()
    try:
        k8s_config.load_kube_config(
            config_file=path, context=context, client_configuration=configuration, persist_config=False
        )
    except (k8s_config.ConfigException, OSError, ValueError) as exc:
        where = path or "the default kubeconfig ($KUBECONFIG or ~/.kube/config)"
        raise ClusterError(f"cannot load {where}" + (f" context {context!r}" if context else "") + f": {exc}") from exc
    return _api_client(configuration)


def _api_client(configuration: Any) -> Any:
    """An `ApiClient` whose connection pool does not retry on its own: `KubeCluster._call` owns retries (bounded,
    with backoff and one log line each). urllib3's default of 3 retries under each of those attempts made one
    unreachable API server cost 4 × `attempts` connections."""
    from kubernetes import client as k8s_client

    configuration.retries = False
    # Connections kept per host: the client's default (5 per CPU) is below what a scheduler uses at once (up to 16
    # binds from kube-scheduler, the background placement writes, the watches), and every request beyond it opened
    # a fresh TLS connection ("Connection pool is full, discarding connection").
    configuration.connection_pool_maxsize = max(int(configuration.connection_pool_maxsize or 0), POOL_CONNECTIONS)
    return k8s_client.ApiClient(configuration)


SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where the kubelet mounts a pod's service account: `token` and `ca.crt`."""
TOKEN_REREAD_SECONDS = 60.0
"""How long a service account token read from its file is used before the file is read again (client-go's
interval): the kubelet rotates bound tokens in place, well before they expire."""


class ServiceAccountToken:
    """The pod's bearer token, from the file the kubelet keeps current; a failed re-read keeps the last token."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reread_seconds = TOKEN_REREAD_SECONDS
        self._lock = threading.Lock()
        self._token = self._read()
        self._read_at = time.monotonic()

    def _read(self) -> str:
        token = self.path.read_text().strip()
        if not token:
            raise ValueError(f"{self.path} is empty")
        return token

    def headers(self) -> dict[str, str]:
        now = time.monotonic()
        if now - self._read_at >= self.reread_seconds:
            with self._lock:
                if now - self._read_at >= self.reread_seconds:
                    try:
                        self._token = self._read()
                    except (OSError, ValueError) as exc:
                        log.warning("re-reading the service account token failed, keeping the last one: %s", exc)
                    self._read_at = now
        return {"Authorization": f"Bearer {self._token}"}


class Transport:
    """Raw JSON requests on one urllib3 connection pool (TLS, client certificates, proxy, keep-alive), each with
    the credentials' current headers; nothing serialized or deserialized by a client library.

    Built from a pod's service account here (`in_cluster`: no `kubernetes` client in the process, 0.3-0.5 s and
    13 MiB fewer at start) or from a kubeconfig through the `kubernetes` client's loader (`from_api_client`: its
    pool and its refreshed credentials, exec plugins and auth providers included). The client's own request
    path (`param_serialize`, `call_api`, `RESTResponse`) cost 10-30 % more CPU per call than this in the same runs
    (`benchmarks/kube_client.py`); a scheduler makes three calls per pod, the node side three more. A 2xx answer
    is returned unread; any other raises `HttpError`.
    """

    # ------------------------------------------------------------------------------------------ transport

    def __init__(
        self,
        host: str,
        manager: urllib3.PoolManager,
        credentials: Callable[[], dict[str, str]],
        close: Callable[[], None] | None = None,
    ) -> None:
        self.host = host.rstrip("/")
        self._credentials = credentials
        self._close = close or manager.clear
        self._urlopen: Callable[..., Any]
        if isinstance(manager, urllib3.ProxyManager):  # a proxy may want absolute URLs: the manager resolves each
            self._urlopen, self._prefix = manager.urlopen, self.host
        else:  # the one host's pool, found once: the manager's lookup per call cost a fifth of the client's CPU
            self._urlopen = manager.connection_from_url(self.host).urlopen
            self._prefix = urllib3.util.parse_url(self.host).path or ""

    @classmethod
    def from_api_client(cls, api_client: Any) -> Transport:
        """The `kubernetes` client's pool manager and the configuration's credentials (a bearer token re-read as
        the client's refresh hook renews it)."""
        configuration = api_client.configuration

        def credentials() -> dict[str, str]:
            headers: dict[str, str] = {}
            for setting in configuration.auth_settings().values():
                if setting.get("in") == "header" and setting.get("value"):
                    headers[str(setting["key"])] = str(setting["value"])
            return headers

        return cls(str(configuration.host), api_client.rest_client.pool_manager, credentials, api_client.close)

    @classmethod
    def in_cluster(cls, account: Path = SERVICE_ACCOUNT) -> Transport:
        """The API server's service address from the environment the kubelet sets, verified against the
        account's CA, with the account's token."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise ValueError("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
        ca = account / "ca.crt"
        if not ca.is_file():
            raise ValueError(f"{ca} does not exist")
        try:
            token = ServiceAccountToken(account / "token")
        except OSError as exc:
            raise ValueError(f"cannot read the service account token: {exc}") from exc
        manager = urllib3.PoolManager(maxsize=POOL_CONNECTIONS, cert_reqs="CERT_REQUIRED", ca_certs=str(ca))
        server = f"[{host}]" if ":" in host else host  # an IPv6 service address
        return cls(f"https://{server}:{port}", manager, token.headers)

    def close(self) -> None:
        self._close()

    def send(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: tuple[float, float] = REQUEST_TIMEOUT,
    ) -> Any:
        headers = {"Accept": "application/json", **self._credentials()}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = msgspec.json.encode(body)
        url = self._prefix + path + (f"?{urlencode(query)}" if query else "")
        response = self._urlopen(
            method,
            url,
            body=data,
            headers=headers,
            timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]),
            retries=False,  # `KubeCluster._call` owns retries
            redirect=False,
            preload_content=False,
        )
        if not 200 <= int(response.status) <= 299:
            try:
                answer = response.data
            finally:
                response.release_conn()
            raise HttpError(int(response.status), answer or b"", response.headers)
        return response


def read_json(response: Any) -> Any:
    try:
        data = response.data
    finally:
        response.release_conn()
    return decode_json(data) if data else None


def decode_json(data: bytes) -> Any:
    """A JSON document from the API server as plain Python objects (msgspec: a watch event or a list decoded in
    about a third of the time `json.loads` takes); a malformed one raises ValueError."""
    return msgspec.json.decode(data)
