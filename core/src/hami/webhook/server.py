"""The admission webhook's HTTPS face: `POST /mutate` (and HAMi's `/webhook`), `/healthz`, `/readyz`.

Owns the transport: a threaded HTTP/1.1 server whose TLS certificate and key are re-read from their files
when they change (checked on every new connection, so a rotated certificate is served from the next
connection on, without a restart; a half-written or mismatched pair is refused with a warning and the
previous one kept), bounded bodies (413 past `MAX_BODY_BYTES`, 411 without a length), and time limits on the
handshake and on reading a body, so a slow or silent client holds one thread for a bounded time.

`WebhookApp.handle` is the whole protocol as a pure function of (method, path, body): a body that is not JSON
or not an AdmissionReview gets a 400 that says why, everything else an AdmissionReview answer from
`hami.webhook.admission`. It never raises; the tests fuzz it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hami.errors import ConfigError
from hami.plugins import VendorHost
from hami.webhook.admission import AdmissionSettings, BadReview, LabelsOf, QuotaCheck, admit_review

__all__ = ["MAX_BODY_BYTES", "ReloadingTLS", "WebhookApp", "WebhookServer"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
"""An AdmissionReview carries one pod (at most about 1.5 MiB in etcd, twice that encoded); beyond this, 413."""

IO_TIMEOUT_SECONDS = 10.0
"""Per read or write on a connection, including the TLS handshake (kube-apiserver's webhook timeout is 10 s)."""

BODY_DEADLINE_SECONDS = 30.0
"""The whole body must arrive within this, however slowly it trickles."""

PATHS = ("/mutate", "/webhook")
"""`/webhook` is the path HAMi's own chart registers."""

Response = tuple[int, Any]


class WebhookApp:
    """The webhook protocol over the vendor host, a quota view and the namespaces' labels."""

    def __init__(
        self,
        host: VendorHost,
        *,
        settings: AdmissionSettings | None = None,
        quota: QuotaCheck | None = None,
        namespace_labels: LabelsOf | None = None,
        ready: Callable[[], bool] = lambda: True,
        observe: Callable[[bool, float], None] = lambda allowed, seconds: None,
        paths: Sequence[str] = PATHS,
    ) -> None:
        self.host = host
        self.settings = settings or AdmissionSettings()
        self.quota = quota
        self.namespace_labels = namespace_labels
        self.ready = ready
        self.observe = observe
        self.paths = tuple(paths)

    def handle(self, method: str, path: str, body: bytes) -> Response:
        route = path.split("?", 1)[0]
        if route == "/healthz" and method == "GET":
            return 200, {"status": "ok"}
        if route == "/readyz" and method == "GET":
            return (200, {"status": "ready"}) if self.ready() else (503, {"status": "syncing"})
        if route not in self.paths:
            return 404, {"error": f"no such endpoint {route}; POST an AdmissionReview to {self.paths[0]}"}
        if method != "POST":
            return 405, {"error": f"{route} takes POST"}
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as exc:
            return 400, {"error": f"the body is not JSON: {exc}"}
        start = time.perf_counter()
        try:
            answer = admit_review(
                data, self.host, settings=self.settings, quota=self.quota, namespace_labels=self.namespace_labels
            )
        except BadReview as exc:
            return 400, {"error": f"not an AdmissionReview this webhook can answer: {exc}"}
        self.observe(bool(answer["response"]["allowed"]), time.perf_counter() - start)
        return 200, answer


# --------------------------------------------------------------------------------------------------------
# TLS from files, reloaded when they change
# --------------------------------------------------------------------------------------------------------


def _server_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    return context


class ReloadingTLS:
    """The server's SSLContext, rebuilt when the certificate or key file changes (inode, mtime or size: what a
    rename, a rewrite or a Kubernetes Secret volume's symlink swap changes)."""

    def __init__(self, certfile: str, keyfile: str) -> None:
        self.certfile = certfile
        self.keyfile = keyfile
        self._lock = threading.Lock()
        signature = self._signature()
        try:
            self._context = _server_context(certfile, keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot serve TLS with certificate {certfile} and key {keyfile}: {exc}; "
                "make a pair with `hami webhook certs`"
            ) from None
        self._loaded = signature
        self._refused: tuple[tuple[int, int, int], ...] | None = None
        self.reloads = 0

    def _signature(self) -> tuple[tuple[int, int, int], ...] | None:
        try:
            stats = [os.stat(self.certfile), os.stat(self.keyfile)]
        except OSError:
            return None
        return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in stats)

    def context(self) -> ssl.SSLContext:
        """The context for a new connection, reloaded first when the files changed since the last load."""
        signature = self._signature()
        if signature is None or signature == self._loaded or signature == self._refused:
            return self._context
        with self._lock:
            if signature != self._loaded and signature != self._refused:
                try:
                    self._context = _server_context(self.certfile, self.keyfile)
                except (OSError, ssl.SSLError) as exc:
                    self._refused = signature
                    log.warning(
                        "the new TLS certificate/key in %s, %s cannot be used (%s); still serving the previous one",
                        self.certfile, self.keyfile, exc,
                    )  # fmt: skip
                else:
                    self._loaded = signature
                    self.reloads += 1
                    log.info("TLS certificate reloaded from %s", self.certfile)
            return self._context


# --------------------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    timeout = IO_TIMEOUT_SECONDS
    server: WebhookServer

    def setup(self) -> None:
        self.request.settimeout(self.timeout)
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()  # here, on this connection's thread: never in the accept loop
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _answer(self, status: int, payload: Any) -> None:
        body = json.dumps(payload, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _read_body(self, length: int) -> bytes | None:
        deadline = time.monotonic() + BODY_DEADLINE_SECONDS
        chunks: list[bytes] = []
        remaining = length
        while remaining > 0:
            if time.monotonic() > deadline:
                return None
            chunk = self.rfile.read1(min(remaining, 1 << 16))
            if not chunk:
                return None
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def _serve(self, method: str) -> None:
        body = b""
        if method == "POST":
            if self.headers.get("Transfer-Encoding") or self.headers.get("Content-Length") is None:
                self.close_connection = True
                self._answer(411, {"error": "send the body with a Content-Length (chunked bodies are not accepted)"})
                return
            try:
                length = int(self.headers["Content-Length"])
            except ValueError:
                self.close_connection = True
                self._answer(400, {"error": "Content-Length is not a number"})
                return
            if length < 0 or length > MAX_BODY_BYTES:
                self.close_connection = True
                self._answer(413, {"error": f"the body must be between 0 and {MAX_BODY_BYTES} bytes, not {length}"})
                return
            data = self._read_body(length)
            if data is None:
                self.close_connection = True
                self._answer(400, {"error": f"the body ended before its {length} bytes arrived"})
                return
            body = data
        try:
            status, payload = self.server.app.handle(method, self.path, body)
        except Exception:  # the app must not fail, but if it does the client gets an answer, not a hang
            log.exception("webhook request %s %s failed", method, self.path)
            status, payload = 500, {"error": "internal error; see the webhook's log"}
        self._answer(status, payload)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


class WebhookServer(ThreadingHTTPServer):
    """A threaded HTTPS (or, without a certificate, plain HTTP) server for a `WebhookApp`."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, app: WebhookApp, address: tuple[str, int], *, certfile: str | None = None, keyfile: str | None = None
    ) -> None:
        self.app = app
        if bool(certfile) != bool(keyfile):
            raise ConfigError("TLS needs both a certificate file and a key file")
        self.tls = ReloadingTLS(certfile, keyfile) if certfile and keyfile else None
        super().__init__(address, _Handler)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = self.socket.accept()
        if self.tls is None:
            return sock, address
        try:
            wrapped = self.tls.context().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except OSError:
            sock.close()
            raise
        return wrapped, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that fail the handshake, time out or hang up: routine on a network, not worth a traceback.
        log.debug("connection from %s ended with an error", client_address, exc_info=True)

    def start(self) -> WebhookServer:
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, name="webhook-https", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
