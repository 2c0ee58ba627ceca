"""The one HTTP front of every listener HAMi serves: the scheduler extender, the admission webhook, the
scheduler's metrics, the node's metrics and the dashboard, on uvicorn (its httptools protocol).

Owns the transport they share, with one set of limits:

- the listening socket is bound and listening (backlog `BACKLOG`) before `start` returns, and `start` returns
  only once the server accepts: a caller that has started every listener is ready to say so (`accepting`);
- a request's headers must arrive within `HEADER_DEADLINE_SECONDS` of its first byte (the first request's,
  of the connection; a TLS handshake within the same deadline) and its body within
  `BODY_DEADLINE_SECONDS` (however slowly either trickles); the request line and headers are at most
  `MAX_HEADER_BYTES` (431 beyond); an idle keep-alive connection is closed after
  `KEEP_ALIVE_SECONDS`; at most `MAX_CONNECTIONS` connections are open (beyond, 503);
- at most `IN_FLIGHT` requests are handled at once (each in a worker thread: the apps' work is blocking),
  the others wait their turn on their connection;
- a body needs a Content-Length (411 otherwise), is refused above the listener's `max_body` before a byte of
  it is read (413), and is read into one buffer, which the app parses once; memory follows what arrives, not
  what a client announces: a body up to `SMALL_BODY` grows as its bytes come, and a larger one first takes its
  size from the listener's budget of large bodies (`body_budget`, twice `max_body`), waiting for its turn
  within the body deadline (503 when none came), and holds it until its answer is sent, so headers alone
  announcing large bodies on many connections cost nothing;
  once a large body is answered, the heap's free memory is handed back to the system (`give_back_memory`);
- an answer above `SEND_CHUNK` bytes is sent a slice at a time as the client reads it, so that its only copy in
  full is the app's;
- TLS, when given a certificate and key, re-reads them when their files change (checked on every handshake,
  so a rotated certificate is served from the next connection on, without a restart; a half-written or
  mismatched pair is refused with a warning and the previous one kept); with a client CA, clients must present
  a certificate it signed.

An app is `handle(method, path, body) -> (status, payload)` (the path as the client wrote it, with its query): a
payload is sent as JSON, or as it is when it is a `Raw`. `handle` must not raise (a 500 answers it if it does, and
is logged). An app may also have `quick(method, path, body) -> (status, payload) | None` (`QuickApp`), called on
the server's event loop before a worker is asked: it answers what it can answer at once, without I/O and without
waiting on anything but short locks, saving the two hand-offs between threads (each one a wake-up and a turn of
the interpreter lock: on a busy machine most of a short request's tail); None sends the request to `handle` in a
worker as usual. While `quick` runs the listener reads nothing else, so it is for work of a few milliseconds.
Why uvicorn: see benchmarks/http_servers.py and docs/http-front.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, Self, runtime_checkable

import msgspec
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hami.errors import ConfigError

__all__ = [
    "BACKLOG",
    "BODY_DEADLINE_SECONDS",
    "HEADER_DEADLINE_SECONDS",
    "IN_FLIGHT",
    "KEEP_ALIVE_SECONDS",
    "MAX_CONNECTIONS",
    "MAX_HEADER_BYTES",
    "SEND_CHUNK",
    "SMALL_BODY",
    "JsonApp",
    "QuickApp",
    "JsonServer",
    "MetricsServer",
    "Raw",
    "ReloadingTLS",
    "give_back_memory",
]

log = logging.getLogger(__name__)

HEADER_DEADLINE_SECONDS = 10.0
"""From a request's first byte to the end of its headers (kube-apiserver's webhook timeout is 10 s)."""
BODY_DEADLINE_SECONDS = 30.0
"""From the end of the headers to the end of the body."""
KEEP_ALIVE_SECONDS = 60
"""An idle connection is closed after this (kube-scheduler and kube-apiserver keep theirs open to reuse)."""
BACKLOG = 2048
"""Connections the kernel queues before the server accepts them."""
MAX_CONNECTIONS = 4096
"""Open connections (and requests) at once; beyond, 503."""
IN_FLIGHT = 32
"""Requests handled at once per listener; more wait on their connections."""
SMALL_BODY = 1024 * 1024
"""Bodies up to this size are read as they arrive; larger ones share the listener's `body_budget`."""
SEND_CHUNK = 256 * 1024
"""Answers larger than this are sent in slices of this size (so the HTTP layer never copies a whole one)."""
MAX_HEADER_BYTES = 16 * 1024
"""A request's line and headers together (h11's default, which this front had before httptools); beyond, 431."""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):  # not glibc
        return None
    return trim


_MALLOC_TRIM = _malloc_trim()


def give_back_memory() -> None:
    """Hand the free memory of the process's heap back to the system (glibc's `malloc_trim`; nothing elsewhere):
    after a large body, the small blocks its answer freed would otherwise stay resident."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _handshake_deadline(loop: asyncio.AbstractEventLoop, seconds: float) -> None:
    """TLS handshakes on `loop`'s servers cut off after `seconds` (asyncio's default is 60 s, and uvicorn passes
    none): the header deadline's clock starts once the handshake is done, so a client that trickles its handshake
    (or sends none) would otherwise hold a connection for a minute."""
    create = loop.create_server

    async def create_server(*args: Any, **kwargs: Any) -> asyncio.Server:
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", seconds)
        return await create(*args, **kwargs)

    loop.create_server = create_server  # type: ignore[method-assign]


class JsonApp(Protocol):
    def handle(self, method: str, path: str, body: bytes) -> tuple[int, Any]: ...


@runtime_checkable
class QuickApp(JsonApp, Protocol):
    """An app that answers some requests on the server's event loop (see the module's docstring)."""

    def quick(self, method: str, path: str, body: bytes) -> tuple[int, Any] | None: ...


@dataclass(frozen=True, slots=True)
class Raw:
    """A payload sent as these bytes with this content type (metrics' text format, the dashboard's pages), not
    as JSON, with these headers besides."""

    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


# --------------------------------------------------------------------------------------------------------
# TLS from files, reloaded when they change
# --------------------------------------------------------------------------------------------------------


def _server_context(certfile: str, keyfile: str, client_ca: str | None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    if client_ca:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class ReloadingTLS:
    """The server's SSLContext, rebuilt when the certificate, key (or client CA) file changes (inode, mtime or
    size: what a rename, a rewrite or a Kubernetes Secret volume's symlink swap changes).

    `base` is the context the server listens with; its SNI callback, run on every handshake (with or without a
    server name), hands the connection the current context."""

    def __init__(self, certfile: str, keyfile: str, client_ca: str | None = None) -> None:
        self.certfile = certfile
        self.keyfile = keyfile
        self.client_ca = client_ca
        self._lock = threading.Lock()
        signature = self._signature()
        try:
            self._context = _server_context(certfile, keyfile, client_ca)
            self.base = _server_context(certfile, keyfile, client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot serve TLS with certificate {certfile}, key {keyfile}"
                + (f" and client CA {client_ca}" if client_ca else "")
                + f": {exc}; make a pair with `hami webhook certs`"
            ) from None
        self.base.sni_callback = self._on_handshake
        self._loaded = signature
        self._refused: tuple[tuple[int, int, int], ...] | None = None
        self.reloads = 0

    def _on_handshake(self, connection: ssl.SSLObject, server_name: str | None, base: ssl.SSLContext) -> None:
        connection.context = self.context()

    def _signature(self) -> tuple[tuple[int, int, int], ...] | None:
        try:
            stats = [os.stat(path) for path in (self.certfile, self.keyfile, self.client_ca) if path]
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
                    self._context = _server_context(self.certfile, self.keyfile, self.client_ca)
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
# The protocol: the header deadline and cap (uvicorn has neither of its own on httptools), one send an answer
# --------------------------------------------------------------------------------------------------------


class _OneSend:
    """A connection's transport whose writes of one answer leave in one send (the HTTP layer writes an answer's
    head and its body apart): what is written while the answer's body is still due (`body_due`) is held, up to
    `SEND_CHUNK` bytes, and goes out with the rest. Between two sends the event loop gives up the interpreter
    lock for the system call, and on a busy process taking it back can cost milliseconds before the body
    follows the head the client already waits on. Everything else is the transport's."""

    def __init__(self, transport: asyncio.Transport, body_due: Callable[[], bool]) -> None:
        self._transport = transport
        self._body_due = body_due
        self._held = b""

    def write(self, data: bytes) -> None:
        if self._held:
            data, self._held = self._held + data, b""
        if len(data) < SEND_CHUNK and self._body_due():
            self._held = data
            return
        self._transport.write(data)

    def close(self) -> None:
        if self._held:
            data, self._held = self._held, b""
            self._transport.write(data)
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Protocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol on httptools (llhttp, in C: a request's parsing cost a third of what h11's pure
    Python did, `benchmarks/http_servers.py`), with a deadline from a request's first byte to the end of its
    headers, a cap on the bytes of the headers (`MAX_HEADER_BYTES`, which llhttp leaves to its caller), and each
    answer written in one send (`_OneSend`)."""

    _header_timer: asyncio.TimerHandle | None = None
    header_deadline = HEADER_DEADLINE_SECONDS
    _awaiting_headers = True
    """From the connection's start, or the end of a request, to the end of the next request's headers."""
    _header_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = _OneSend(transport, self._body_due)  # type: ignore[assignment]
        # A connection that never sends a byte is closed too (uvicorn times out only idle keep-alive ones).
        self._header_timer = self.loop.call_later(self.header_deadline, self._headers_too_slow)

    def _body_due(self) -> bool:
        """Whether the answer being written has body bytes still to come (what the cycle was told and has not
        been given yet; a HEAD answer's head comes alone)."""
        cycle = self.cycle
        return (
            cycle is not None
            and not cycle.response_complete
            and cycle.expected_content_length > 0
            and cycle.scope["method"] != "HEAD"
        )

    def data_received(self, data: bytes) -> None:
        if self._awaiting_headers:
            self._header_bytes += len(data)
        super().data_received(data)
        if self._awaiting_headers and self._header_bytes > MAX_HEADER_BYTES and not self.transport.is_closing():
            log.debug("closing a connection whose request headers passed %d bytes", MAX_HEADER_BYTES)
            self._send_431()

    def _send_431(self) -> None:
        message = f"the request line and headers must be at most {MAX_HEADER_BYTES} bytes".encode()
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(message), message)
        )
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_deadline, self._headers_too_slow)

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._header_bytes = 0
        self._cancel_header_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._awaiting_headers = True

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self._awaiting_headers and not self.transport.is_closing():
            log.debug("closing a connection whose request headers took over %.1f s", self.header_deadline)
            self.transport.close()

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)


# --------------------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------------------


class _BadBody(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message


class JsonServer:
    """One listener: an app behind uvicorn, HTTPS when given a certificate (and client-certificate verification
    when given a client CA). Subclasses set `name`, `error_key` and `max_body`."""

    name = "server"
    """Names the server in logs and error messages."""
    error_key = "error"
    """The key of the error message in an error answer (kube-scheduler's extender protocol says `Error`)."""
    max_body = 8 * 1024 * 1024
    """Bodies above this many bytes are refused with 413."""
    header_deadline = HEADER_DEADLINE_SECONDS
    body_deadline = BODY_DEADLINE_SECONDS
    small_body = SMALL_BODY
    body_budget: int | None = None
    """Bytes of bodies above `small_body` held at once (read or being answered); None: twice `max_body`."""

    def __init__(
        self,
        app: JsonApp,
        address: tuple[str, int],
        *,
        certfile: str | None = None,
        keyfile: str | None = None,
        client_ca: str | None = None,
    ) -> None:
        self.app = app
        self._quick = app.quick if isinstance(app, QuickApp) else None
        if bool(certfile) != bool(keyfile):
            raise ConfigError("TLS needs both a certificate file and a key file")
        if client_ca and not certfile:
            raise ConfigError("verifying client certificates needs TLS: give a certificate and key too")
        self.tls = ReloadingTLS(certfile, keyfile, client_ca) if certfile and keyfile else None
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        # IPPROTO_TCP named, so that asyncio sets TCP_NODELAY on every accepted connection (it checks the
        # protocol): without it, a response written in two parts waits for the client's delayed ACK (40 ms).
        self.socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(address)
            self.socket.listen(BACKLOG)
        except OSError:
            self.socket.close()
            raise
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]
        self._pool = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix=f"{self.name}-work")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._budget = self.body_budget if self.body_budget is not None else 2 * self.max_body
        self._held = 0
        self._budget_waiters: list[asyncio.Future[None]] = []

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def accepting(self) -> bool:
        """Started, serving, and not stopped."""
        return bool(self._server is not None and self._server.started and not self._stopped)

    # ---------------------------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 30.0) -> Self:
        """Serve from a thread of its own; returns once the server accepts connections."""
        config = uvicorn.Config(
            self._asgi,
            http=type("_ListenerProtocol", (_Protocol,), {"header_deadline": self.header_deadline}),
            interface="asgi3",
            proxy_headers=False,
            lifespan="off",
            loop="none",
            log_level="warning",
            access_log=False,
            server_header=False,
            date_header=False,
            backlog=BACKLOG,
            limit_concurrency=MAX_CONNECTIONS,
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
            timeout_graceful_shutdown=5,
        )
        config.load()
        config.ssl = self.tls.base if self.tls else None  # ours, reloading, instead of one read once
        self._server = uvicorn.Server(config)
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            _handshake_deadline(loop, self.header_deadline)
            self._loop = loop
            try:
                loop.run_until_complete(self._serve(started))
            except BaseException as exc:  # reported to `start`, or logged once serving
                failure.append(exc)
                if started.is_set():
                    log.exception("%s stopped serving", self.name)
            finally:
                started.set()
                loop.close()

        self._thread = threading.Thread(target=run, name=f"{self.name}-http", daemon=True)
        self._thread.start()
        if not started.wait(timeout) or failure or not self.accepting:
            self.stop()
            raise ConfigError(
                f"the {self.name} could not start serving on {self.server_address}: {failure or 'timeout'}"
            )
        return self

    async def _serve(self, started: threading.Event) -> None:
        server = self._server
        assert server is not None
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[self.socket]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        started.set()
        await task

    def stop(self) -> None:
        self._stopped = True
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
        with contextlib.suppress(OSError):
            self.socket.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------------------------- requests

    async def _asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        method = str(scope["method"])
        raw_path = scope.get("raw_path")  # as the client wrote it, percent-escapes and all (the apps unquote)
        path = bytes(raw_path).decode("latin-1") if raw_path else str(scope["path"])
        if scope.get("query_string"):
            path += "?" + bytes(scope["query_string"]).decode("latin-1")
        reserved = 0
        try:
            try:
                length = self._length(scope)
                async with asyncio.timeout(self.body_deadline):
                    if length > self.small_body:
                        await self._reserve(length)
                        reserved = length
                    body = await self._body(receive, length, preallocate=reserved > 0)
            except _BadBody as exc:
                await self._answer(send, exc.status, {self.error_key: exc.message}, close=True)
                return
            except TimeoutError:
                if length > self.small_body and not reserved:
                    status, message = 503, f"too many large bodies at once; none of {length} bytes fitted in time"
                else:
                    status, message = 408, f"the body did not arrive within {self.body_deadline:.0f} s"
                await self._answer(send, status, {self.error_key: message}, close=True)
                return
            if body is None:
                return  # the client went away
            try:
                answer = self._quick(method, path, body) if self._quick is not None else None
                if answer is None:
                    loop = asyncio.get_running_loop()
                    answer = await loop.run_in_executor(self._pool, self.app.handle, method, path, body)
                status, payload = answer
            except Exception:  # the app must not fail, but if it does the client gets an answer, not a hang
                log.exception("%s request %s %s failed", self.name, method, path)
                status, payload = 500, {self.error_key: f"internal error; see the {self.name}'s log"}
            del body
            await self._answer(send, status, payload, head=method == "HEAD")
        finally:
            if reserved:
                self._release(reserved)
                if not self._held:  # the last large body in flight answered
                    give_back_memory()

    def _length(self, scope: Scope) -> int:
        headers = {bytes(k).lower(): bytes(v) for k, v in scope["headers"]}
        method = scope["method"]
        if b"transfer-encoding" in headers or (b"content-length" not in headers and method in ("POST", "PUT")):
            raise _BadBody(411, "send the body with a Content-Length (chunked bodies are not accepted)")
        try:
            length = int(headers.get(b"content-length", b"0"))
        except ValueError:
            raise _BadBody(400, "Content-Length is not a number") from None
        if length < 0 or length > self.max_body:
            raise _BadBody(413, f"the body must be 0 to {self.max_body} bytes, not {length}")
        return length

    async def _reserve(self, length: int) -> None:
        """Take `length` bytes of the large-body budget, waiting until they are free (on the server's loop, so
        nothing else runs between the check and the taking)."""
        while self._held and self._held + length > self._budget:
            waiter = asyncio.get_running_loop().create_future()
            self._budget_waiters.append(waiter)
            await waiter
        self._held += length

    def _release(self, length: int) -> None:
        self._held -= length
        waiters, self._budget_waiters = self._budget_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _body(self, receive: Receive, length: int, *, preallocate: bool) -> bytes | None:
        """The body in one buffer: of its whole size at once when its bytes were reserved, else grown as they
        arrive (what a client announces costs nothing until it sends it)."""
        buffer = bytearray(length) if preallocate else bytearray()
        got = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            if got + len(chunk) > length:
                raise _BadBody(400, f"the body is longer than its Content-Length {length}")
            if preallocate:
                buffer[got : got + len(chunk)] = chunk
            else:
                buffer += chunk
            got += len(chunk)
            if not message.get("more_body"):
                break
        if got != length:
            raise _BadBody(400, f"the body ended before its {length} bytes arrived")
        return buffer  # type: ignore[return-value]  # a bytearray: parsed as bytes are, without a copy

    async def _answer(self, send: Send, status: int, payload: Any, *, close: bool = False, head: bool = False) -> None:
        extra: tuple[tuple[str, str], ...] = ()
        if isinstance(payload, Raw):
            body, content_type, extra = payload.body, payload.content_type, payload.headers
        else:
            body, content_type = _json(payload), "application/json"
        headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in extra]
        if close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        if head or len(body) <= SEND_CHUNK:
            await send({"type": "http.response.body", "body": b"" if head else body})
            return
        # A large body (a metrics scrape at 1,000 nodes is 11 MB) goes out a slice at a time, each sent once the
        # client has taken the one before (uvicorn's flow control): the HTTP layer copies a slice, not the body
        view = memoryview(body)
        for start in range(0, len(body), SEND_CHUNK):
            end = start + SEND_CHUNK
            await send({"type": "http.response.body", "body": bytes(view[start:end]), "more_body": end < len(body)})


# --------------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------------

TEXT = "text/plain; charset=utf-8"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class _MetricsApp:
    def __init__(self, render: Callable[[], bytes], name: str) -> None:
        self.render = render
        self.name = name

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        if path.split("?", 1)[0] != "/metrics":
            return 404, Raw(b"not found; metrics are at /metrics\n", TEXT)
        if method not in ("GET", "HEAD"):
            return 405, Raw(b"/metrics takes GET\n", TEXT)
        try:
            text = self.render()
        except Exception:  # a scrape gets an answer, not a dropped connection
            log.exception("rendering the %s failed", self.name)
            return 500, Raw(f"internal error; see the {self.name}' log\n".encode(), TEXT)
        return 200, Raw(text, PROMETHEUS_TEXT)


class MetricsServer(JsonServer):
    """`GET /metrics` (and HEAD) answering `render()`, the Prometheus text format, on the same front."""

    max_body = 64 * 1024

    def __init__(self, render: Callable[[], bytes], address: tuple[str, int], *, name: str = "metrics") -> None:
        self.name = name
        super().__init__(_MetricsApp(render, name), address)


def _json(payload: Any) -> bytes:
    """An answer's JSON: msgspec's UTF-8, as compact as json's; a lone surrogate, which UTF-8 cannot carry (a
    request may bring one in a string the answer repeats: Python's JSON reader lets it through), is escaped as json
    escapes it."""
    try:
        return msgspec.json.encode(payload)
    except UnicodeEncodeError:
        return json.dumps(payload, separators=(",", ":")).encode()
