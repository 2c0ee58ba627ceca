"""The scheduler extender's HTTP face: kube-scheduler's filter, prioritize and bind verbs, health and readiness.

Owns the wire format of protocol.md section 4: bodies whose keys come in PascalCase (or lowercase, from old
kube-schedulers) are read case-insensitively and answered in PascalCase; with `nodeCacheCapable: true` only
node names travel, otherwise whole node lists. A body that is not what kube-scheduler sends gets a 400 that
says what is wrong; nothing a client sends can make the server answer 500 or hang (bodies are bounded).

`ExtenderApp.handle` is the whole protocol as a pure function of (method, path, body), which the tests fuzz;
`ExtenderServer` puts it behind a threaded HTTP/1.1 server with keep-alive, plain or TLS.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hami.scheduler.extender import Extender

__all__ = ["ExtenderApp", "ExtenderServer", "MAX_BODY_BYTES"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Large enough for a full NodeList of thousands of nodes; beyond it the request is refused with 413."""

Response = tuple[int, Any]


class BadRequest(ValueError):
    pass


def _lower_keys(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"expected a JSON object, got {type(value).__name__}")
    return {str(k).lower(): v for k, v in value.items()}


def _names(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise BadRequest(f"{what} must be a list of node names")
    return value


class ExtenderApp:
    """The extender protocol over an `Extender`; `observe` receives (verb, seconds) for metrics."""

    def __init__(
        self,
        extender: Extender,
        *,
        ready: Callable[[], bool] = lambda: True,
        observe: Callable[[str, float], None] = lambda verb, seconds: None,
        prefix: str = "",
    ) -> None:
        self.extender = extender
        self.ready = ready
        self.observe = observe
        self.prefix = prefix.rstrip("/")

    def handle(self, method: str, path: str, body: bytes) -> Response:
        route = path.split("?", 1)[0]
        if method == "GET" and route == "/healthz":
            return 200, {"status": "ok"}
        if method == "GET" and route == "/readyz":
            return (200, {"status": "ready"}) if self.ready() else (503, {"status": "syncing"})
        verb = route[len(self.prefix) :].strip("/") if route.startswith(self.prefix + "/") else ""
        if verb not in ("filter", "prioritize", "bind"):
            return 404, {"Error": f"no such endpoint {route}; POST {self.prefix}/filter, /prioritize or /bind"}
        if method != "POST":
            return 405, {"Error": f"{route} takes POST"}
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as exc:
            return 400, {"Error": f"the body is not JSON: {exc}"}
        start = time.perf_counter()
        try:
            if verb == "filter":
                return 200, self._filter(_lower_keys(data))
            if verb == "prioritize":
                return 200, self._prioritize(_lower_keys(data))
            return 200, self._bind(_lower_keys(data))
        except BadRequest as exc:
            return 400, {"Error": f"{verb}: {exc}"}
        finally:
            self.observe(verb, time.perf_counter() - start)

    def _candidates(self, args: Mapping[str, Any]) -> tuple[list[str], dict[str, Any] | None]:
        nodes = args.get("nodes")
        if nodes is not None:
            items = _lower_keys(nodes).get("items") or []
            if not isinstance(items, list):
                raise BadRequest("Nodes.items must be a list of nodes")
            by_name: dict[str, Any] = {}
            for item in items:
                name = (item.get("metadata") or {}).get("name") if isinstance(item, dict) else None
                if not isinstance(name, str):
                    raise BadRequest("every node in Nodes.items needs metadata.name")
                by_name[name] = item
            return list(by_name), by_name
        return _names(args.get("nodenames"), "NodeNames"), None

    def _filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        pod = args.get("pod")
        if not isinstance(pod, dict) or not isinstance((pod.get("metadata") or {}).get("name"), str):
            raise BadRequest("Pod must be a pod object with metadata.name")
        names, objects = self._candidates(args)
        result = self.extender.filter(pod, names)
        chosen = names if result.passthrough else ([result.node] if result.node else [])
        answer: dict[str, Any] = {"FailedNodes": result.failed, "FailedAndUnresolvableNodes": {}, "Error": result.error}
        if objects is not None:
            answer["Nodes"] = {"metadata": {}, "items": [objects[n] for n in chosen]}
            answer["NodeNames"] = None
        else:
            answer["Nodes"] = None
            answer["NodeNames"] = chosen
        return answer

    def _prioritize(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        pod = args.get("pod")
        if not isinstance(pod, dict):
            raise BadRequest("Pod must be a pod object")
        names, _ = self._candidates(args)
        scores = self.extender.prioritize(pod, names)
        return [{"Host": n, "Score": scores.get(n, 0)} for n in names]

    def _bind(self, args: Mapping[str, Any]) -> dict[str, Any]:
        fields = {}
        for key in ("podname", "podnamespace", "poduid", "node"):
            value = args.get(key)
            if not isinstance(value, str) or (key != "poduid" and not value):
                raise BadRequest("needs PodName, PodNamespace, PodUID and Node as strings")
            fields[key] = value
        result = self.extender.bind(fields["podnamespace"], fields["podname"], fields["poduid"], fields["node"])
        return {"Error": result.error}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes: never wait for a delayed ACK
    server: ExtenderServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _answer(self, status: int, payload: Any) -> None:
        body = json.dumps(payload, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve(self, method: str) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self._answer(400, {"Error": "Content-Length is not a number"})
            return
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            self._answer(413, {"Error": f"the body is larger than {MAX_BODY_BYTES} bytes"})
            return
        body = self.rfile.read(length) if length else b""
        try:
            status, payload = self.server.app.handle(method, self.path, body)
        except Exception:  # the app must not fail, but if it does the client gets an answer, not a hang
            log.exception("extender request %s %s failed", method, self.path)
            status, payload = 500, {"Error": "internal error; see the extender's log"}
        self._answer(status, payload)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")


class ExtenderServer(ThreadingHTTPServer):
    """A threaded HTTP/1.1 server for an `ExtenderApp`, optionally TLS from certificate and key files."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, app: ExtenderApp, address: tuple[str, int], *, certfile: str | None = None, keyfile: str | None = None
    ) -> None:
        self.app = app
        super().__init__(address, _Handler)
        if certfile:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(certfile, keyfile)
            self.socket = context.wrap_socket(self.socket, server_side=True)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> ExtenderServer:
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, name="extender-http", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
