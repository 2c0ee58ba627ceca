"""How the Kubernetes backend reaches the API server: the connection, the credentials, raw JSON on the wire.

Owns the connections: its own kept-alive HTTP/1.1 connections for every call answered at once (`Connections`: one
send a request, the answer parsed by llhttp; a call took a third of urllib3's CPU, `benchmarks/kube_client.py`), and
one urllib3 connection pool for the watches' streams and for what `Connections` does not do (a proxy, socket options
of a kubeconfig's own); and the headers each request carries,
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

import collections
import json
import logging
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httptools
import msgspec
import urllib3

from hami.cluster.port import ClusterError, ConflictError, NotFoundError

__all__ = [
    "CONNECTION_ERRORS",
    "POOL_CONNECTIONS",
    "REQUEST_TIMEOUT",
    "SERVICE_ACCOUNT",
    "TOKEN_REREAD_SECONDS",
    "Answer",
    "Connections",
    "HttpError",
    "NotSent",
    "Transport",
    "connection_error",
    "decode_json",
    "kubeconfig_api_client",
    "never_sent",
    "read_body",
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
        self.headers: Mapping[str, str] = {k.lower(): v for k, v in (headers or {}).items()}
        """Header names in lower case."""
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
    if isinstance(exc, NotSent):
        return True
    reason = getattr(exc, "reason", None)
    return isinstance(exc, urllib3.exceptions.ConnectTimeoutError) or isinstance(
        reason, urllib3.exceptions.ConnectTimeoutError | ConnectionRefusedError
    )


CONNECTION_ERRORS: tuple[type[Exception], ...] = (urllib3.exceptions.HTTPError, OSError)
"""What a request that got no answer raises: the connection failed, timed out or broke."""


class NotSent(ConnectionError):
    """A request that never left: its connection (TCP or the TLS handshake) could not be made."""


class Answer:
    """A whole answer read by `Connections`: status, headers (names in lower case) and body."""

    __slots__ = ("_chunks", "complete", "data", "headers", "keep_alive", "parser", "status")

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.data = b""
        self.complete = False
        self.keep_alive = False
        self.parser = httptools.HttpResponseParser(self)
        self._chunks: list[bytes] = []

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1").strip()

    def on_headers_complete(self) -> None:
        # read here: once the message is complete, the parser is reset for the next one
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        self.data = b"".join(self._chunks)
        self._chunks.clear()
        self.complete = True


_READ = 256 * 1024


class Connections:
    """Kept-alive HTTP/1.1 connections to the API server for the calls answered at once (every call but a watch):
    a request goes out in one send, and its answer is parsed by llhttp (httptools). urllib3's request path
    (`HTTPConnectionPool.urlopen`, http.client's header parsing through the email package) cost more CPU than the
    TLS and the JSON together; a scheduler makes two calls per placed pod, the node side two more.

    A connection found readable while idle (the server closed it, or sent what nobody asked for) is closed
    instead of used. What fails while connecting raises `NotSent`; what fails after, an `OSError`. Thread-safe."""

    def __init__(
        self, address: tuple[str, int], context: ssl.SSLContext | None, server_name: str | None, keep: int
    ) -> None:
        """`context`: TLS with the server, its certificate checked for `server_name`; None: plain HTTP."""
        self.address = address
        self.context = context
        self.server_name = server_name
        self.keep = keep
        # a deque's append and pop are atomic: no lock, which 16 binds at once would queue on (each wait a
        # switch of threads and of the interpreter lock)
        self._idle: collections.deque[socket.socket] = collections.deque()
        self._closed = False

    def exchange(self, request: bytes, timeout: tuple[float, float]) -> Answer:
        """Send `request` (its head and body) and read its answer whole."""
        sock = self._take(timeout[0])
        answer = Answer()
        try:
            sock.settimeout(timeout[1])
            sock.sendall(request)
            while not answer.complete:
                data = sock.recv(_READ)
                if not data:
                    raise ConnectionError("the API server closed the connection before its answer was complete")
                answer.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            sock.close()
            raise ConnectionError(f"the API server's answer is not HTTP/1.1: {exc}") from None
        except BaseException:
            sock.close()
            raise
        finally:
            answer.parser = None  # type: ignore[assignment]  # the parser and its answer refer to each other
        if answer.keep_alive:
            self._give(sock)
        else:
            sock.close()
        return answer

    def _take(self, connect_timeout: float) -> socket.socket:
        while True:
            try:
                sock = self._idle.pop()
            except IndexError:
                break
            if not _dropped(sock):
                return sock
            sock.close()
        try:
            raw = socket.create_connection(self.address, timeout=connect_timeout)
        except OSError as exc:
            raise NotSent(f"cannot connect to {self.address[0]}:{self.address[1]}: {exc}") from exc
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return raw if self.context is None else self.context.wrap_socket(raw, server_hostname=self.server_name)
        except OSError as exc:
            raw.close()
            raise NotSent(f"TLS with {self.address[0]}:{self.address[1]} failed: {exc}") from exc

    def _give(self, sock: socket.socket) -> None:
        if len(self._idle) >= self.keep:
            sock.close()
            return
        self._idle.append(sock)
        if self._closed:  # closed before or meanwhile: what `close` did not see is closed here
            self._drain()

    def close(self) -> None:
        self._closed = True
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                self._idle.pop().close()
            except IndexError:
                return


def _dropped(sock: socket.socket) -> bool:
    """Whether an idle connection can no longer carry a request: anything readable on it (the server's close,
    or bytes nobody asked for) ends it."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(0))


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


def _connections_of(configuration: Any, manager: urllib3.PoolManager) -> Connections | None:
    """The lean path for a `kubernetes` client configuration, with the TLS its pool would use (its CA, client
    certificate, verification and server name); None where the pool does what `Connections` does not (a proxy,
    socket options of its own), and urllib3 carries every call."""
    if isinstance(manager, urllib3.ProxyManager) or configuration.proxy or configuration.socket_options:
        return None
    url = urllib3.util.parse_url(str(configuration.host))
    if url.scheme not in ("http", "https") or not url.host:
        return None
    port = url.port or (443 if url.scheme == "https" else 80)
    host = url.host.strip("[]")
    if url.scheme == "http":
        return Connections((host, port), None, None, POOL_CONNECTIONS)
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
    if getattr(configuration, "ca_cert_data", None):
        data = configuration.ca_cert_data
        context.load_verify_locations(cadata=data.decode() if isinstance(data, bytes) else data)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    server_name = configuration.tls_server_name or host
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif configuration.assert_hostname is False:
        context.check_hostname = False
    elif isinstance(configuration.assert_hostname, str):
        server_name = configuration.assert_hostname
    return Connections((host, port), context, server_name, POOL_CONNECTIONS)


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
        connections: Connections | None = None,
    ) -> None:
        """`connections`: the lean path for calls answered at once (`Connections`); without it, urllib3 carries
        every call. Watches always go through urllib3's pool (`manager`)."""
        self.host = host.rstrip("/")
        self._credentials = credentials
        self._close = close or manager.clear
        self._connections = connections
        self._authority = urllib3.util.parse_url(self.host).netloc or ""
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

        manager = api_client.rest_client.pool_manager
        connections = _connections_of(configuration, manager)
        return cls(str(configuration.host), manager, credentials, api_client.close, connections=connections)

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
        try:
            context = ssl.create_default_context(cafile=str(ca))  # the name (or IP) checked, as urllib3 checks it
            address = (host, int(port))
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot use {ca} and port {port!r}: {exc}") from exc
        connections = Connections(address, context, host, POOL_CONNECTIONS)
        return cls(f"https://{server}:{port}", manager, token.headers, connections=connections)

    def close(self) -> None:
        if self._connections is not None:
            self._connections.close()
        self._close()

    def _request(self, method: str, target: str, headers: dict[str, str], data: bytes | None) -> bytes:
        """One request's bytes: its line, headers and body."""
        if not (target.isascii() and target.isprintable()) or " " in target:
            raise ClusterError(f"cannot send {method} {target!r}: not a request target (spaces, controls, non-ASCII)")
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self._authority}"]
        for name, value in headers.items():
            if not (value.isascii() and value.isprintable() and name.isascii() and name.isprintable()):
                raise ClusterError(f"cannot send {method} {target}: the header {name!r} is not printable ASCII")
            lines.append(f"{name}: {value}")
        if data is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(data or b'')}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head + data if data else head

    def send(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: tuple[float, float] = REQUEST_TIMEOUT,
        *,
        stream: bool = False,
    ) -> Any:
        """The answer: a 2xx one unread (an `Answer` read whole, or urllib3's response when `stream` or without
        the lean path; `read_json` takes either); any other raises `HttpError`."""
        headers = {"Accept": "application/json", **self._credentials()}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            try:
                data = msgspec.json.encode(body)
            except UnicodeEncodeError:  # a lone surrogate (from a request read by Python's JSON reader): escaped
                data = json.dumps(body, separators=(",", ":")).encode()
        url = self._prefix + path + (f"?{urlencode(query)}" if query else "")
        if self._connections is not None and not stream and method in _LEAN_METHODS:
            answer = self._connections.exchange(self._request(method, url, headers, data), timeout)
            if not 200 <= answer.status <= 299:
                raise HttpError(answer.status, answer.data, answer.headers)
            return answer
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


_LEAN_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
"""Methods whose answer has a body exactly when it says so (not HEAD)."""


def read_json(response: Any) -> Any:
    data = read_body(response)
    return decode_json(data) if data else None


def read_body(response: Any) -> bytes:
    """The answer's body as its bytes (an `Answer` read whole, or urllib3's response, its connection then back in
    the pool)."""
    if isinstance(response, Answer):
        return response.data
    try:
        return bytes(response.data)
    finally:
        response.release_conn()


def decode_json(data: bytes) -> Any:
    """A JSON document from the API server as plain Python objects (msgspec: a watch event or a list decoded in
    about a third of the time `json.loads` takes); a malformed one raises ValueError."""
    return msgspec.json.decode(data)
