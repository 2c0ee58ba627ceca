"""A small JSON-over-HTTP(S) server shared by the scheduler extender and the admission webhook.

Owns the transport both need: a threaded HTTP/1.1 server with keep-alive and no Nagle delays; TLS whose
certificate and key are re-read from their files when they change (checked on every new connection, so a
rotated certificate is served from the next connection on, without a restart; a half-written or mismatched
pair is refused with a warning and the previous one kept); bounded bodies (413 past the server's
`max_body`, 411 without a length); and time limits on the handshake and on reading a body, so a slow or silent
client holds one thread for a bounded time. The protocol is the app's: `handle(method, path, body)` returns
(status, JSON-serialisable payload) and must not raise (a 500 answers it if it does).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol, Self

from hami.errors import ConfigError

__all__ = ["BODY_DEADLINE_SECONDS", "IO_TIMEOUT_SECONDS", "JsonApp", "JsonServer", "ReloadingTLS"]

log = logging.getLogger(__name__)

IO_TIMEOUT_SECONDS = 10.0
"""Per read or write on a connection, including the TLS handshake (kube-apiserver's webhook timeout is 10 s)."""

BODY_DEADLINE_SECONDS = 30.0
"""The whole body must arrive within this, however slowly it trickles."""


class JsonApp(Protocol):
    def handle(self, method: str, path: str, body: bytes) -> tuple[int, Any]: ...


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
    disable_nagle_algorithm = True  # headers and body go out in separate writes: never wait for a delayed ACK
    timeout = IO_TIMEOUT_SECONDS
    server: JsonServer

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
                self._answer(
                    411,
                    {self.server.error_key: "send the body with a Content-Length (chunked bodies are not accepted)"},
                )
                return
            try:
                length = int(self.headers["Content-Length"])
            except ValueError:
                self.close_connection = True
                self._answer(400, {self.server.error_key: "Content-Length is not a number"})
                return
            if length < 0 or length > self.server.max_body:
                self.close_connection = True
                self._answer(
                    413,
                    {self.server.error_key: f"the body must be 0 to {self.server.max_body} bytes, not {length}"},
                )
                return
            data = self._read_body(length)
            if data is None:
                self.close_connection = True
                self._answer(400, {self.server.error_key: f"the body ended before its {length} bytes arrived"})
                return
            body = data
        try:
            status, payload = self.server.app.handle(method, self.path, body)
        except Exception:  # the app must not fail, but if it does the client gets an answer, not a hang
            log.exception("%s request %s %s failed", self.server.name, method, self.path)
            status, payload = 500, {self.server.error_key: f"internal error; see the {self.server.name}'s log"}
        self._answer(status, payload)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


class JsonServer(ThreadingHTTPServer):
    """A threaded HTTP/1.1 server, HTTPS when given a certificate, for an app answering (status, JSON payload)."""

    daemon_threads = True
    allow_reuse_address = True
    name = "server"
    """Names the server in logs and error messages."""
    error_key = "error"
    """The key of the error message in an error answer (kube-scheduler's extender protocol says `Error`)."""
    max_body = 8 * 1024 * 1024
    """Bodies above this many bytes are refused with 413."""

    def __init__(
        self, app: JsonApp, address: tuple[str, int], *, certfile: str | None = None, keyfile: str | None = None
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

    def start(self) -> Self:
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, name=f"{self.name}-http", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
