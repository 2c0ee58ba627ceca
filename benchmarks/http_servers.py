"""Which HTTP server carries the extender, the webhook and the metrics: the candidates on this workload.

    python benchmarks/http_servers.py --seconds 3 --json

Serves one handler on loopback with each candidate (the standard library's threaded server the project used
before, uvicorn with its h11 and its httptools parsers, hypercorn, aiohttp) and drives it the way
kube-scheduler drives the extender: keep-alive connections POSTing a filter body with 1,000 node names
(nodeCacheCapable, about 25 KB), one client and then eight at once. The handler reads the whole body, parses it
as JSON and answers a filter-sized JSON object, as the extender does, in a worker thread for the asynchronous
servers (the extender's work is blocking). Prints requests per second and p50/p99 latency per server and
concurrency, and last one JSON object with all of them; `hami.front` is the project's own front (uvicorn with
httptools, its header deadline, its body buffer and its worker threads) on the same handler. Candidates that are not
installed are skipped (`uv pip install uvicorn httptools hypercorn aiohttp`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import multiprocessing
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BODY = json.dumps(
    {"Pod": {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {"containers": []}},
     "NodeNames": [f"node-{i:04d}" for i in range(1000)]}
).encode()  # fmt: skip


def work(body: bytes) -> bytes:
    data = json.loads(body)
    return json.dumps({"NodeNames": data["NodeNames"][:1], "FailedNodes": {}, "Error": ""}).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------------ the candidates


@contextlib.contextmanager
def stdlib(port: int) -> Iterator[None]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_POST(self) -> None:
            answer = work(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


POOL = ThreadPoolExecutor(16)


async def asgi(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    answer = await asyncio.get_running_loop().run_in_executor(POOL, work, b"".join(chunks))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


def in_loop(serve: Callable[[asyncio.AbstractEventLoop, threading.Event], Any]) -> Callable[[int], Any]:
    @contextlib.contextmanager
    def run(port: int) -> Iterator[None]:
        loop = asyncio.new_event_loop()
        stop = threading.Event()
        thread = threading.Thread(target=lambda: loop.run_until_complete(serve(loop, stop, port)), daemon=True)  # type: ignore[call-arg]
        thread.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            time.sleep(0.05)
        try:
            yield
        finally:
            stop.set()
            thread.join(10)

    return run


def uvicorn_with(http: str) -> Callable[[int], Any]:
    async def serve(loop: asyncio.AbstractEventLoop, stop: threading.Event, port: int) -> None:
        import uvicorn

        server = uvicorn.Server(uvicorn.Config(asgi, host="127.0.0.1", port=port, http=http, log_level="error",
                                               lifespan="off", loop="none"))  # fmt: skip
        task = loop.create_task(server.serve())
        while not stop.is_set():
            await asyncio.sleep(0.05)
        server.should_exit = True
        await task

    return in_loop(serve)  # type: ignore[arg-type]


async def _hypercorn(loop: asyncio.AbstractEventLoop, stop: threading.Event, port: int) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.loglevel = "ERROR"
    ended = asyncio.Event()

    async def until() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.05)
        ended.set()

    watcher = loop.create_task(until())
    await serve(asgi, config, shutdown_trigger=ended.wait)  # type: ignore[arg-type]
    await watcher


async def _aiohttp(loop: asyncio.AbstractEventLoop, stop: threading.Event, port: int) -> None:
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        answer = await loop.run_in_executor(POOL, work, await request.read())
        return web.Response(body=answer, content_type="application/json")

    runner = web.ServerRunner(web.Server(handle), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=1024)
    await site.start()
    while not stop.is_set():
        await asyncio.sleep(0.05)
    await runner.cleanup()


@contextlib.contextmanager
def hami_front(port: int) -> Iterator[None]:
    from hami.front import JsonServer

    class App:
        def handle(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
            data = json.loads(body)
            return 200, {"NodeNames": data["NodeNames"][:1], "FailedNodes": {}, "Error": ""}

    server = JsonServer(App(), ("127.0.0.1", port)).start()
    try:
        yield
    finally:
        server.stop()


CANDIDATES: dict[str, tuple[str, Callable[[int], Any]]] = {
    "stdlib-threads": ("http", stdlib),
    "uvicorn-h11": ("uvicorn", uvicorn_with("h11")),
    "uvicorn-httptools": ("httptools", uvicorn_with("httptools")),
    "hypercorn": ("hypercorn", in_loop(_hypercorn)),  # type: ignore[arg-type]
    "aiohttp": ("aiohttp", in_loop(_aiohttp)),  # type: ignore[arg-type]
    "hami.front": ("hami.front", hami_front),  # uvicorn-httptools with the project's deadlines, caps and body buffer
}

# ------------------------------------------------------------------------------------------ the client


def drive(port: int, clients: int, seconds: float) -> dict[str, float]:
    """The figures of `clients` keep-alive clients for `seconds`, from a process of their own (as
    kube-scheduler is), so that the clients do not share the server's interpreter lock."""
    context = multiprocessing.get_context("fork")
    queue: Any = context.Queue()
    child = context.Process(target=lambda: queue.put(_drive(port, clients, seconds)))
    child.start()
    figures: dict[str, float] = queue.get(timeout=seconds + 60)
    child.join()
    return figures


def _drive(port: int, clients: int, seconds: float) -> dict[str, float]:
    latencies: list[list[float]] = [[] for _ in range(clients)]
    end = time.monotonic() + seconds

    def client(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = {"Content-Type": "application/json"}
        while time.monotonic() < end:
            start = time.perf_counter()
            connection.request("POST", "/filter", BODY, headers)
            answer = connection.getresponse()
            answer.read()
            if answer.status != 200:
                raise RuntimeError(f"answer {answer.status}")
            latencies[index].append(time.perf_counter() - start)
        connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - began
    values = sorted(v for per in latencies for v in per)
    return {
        "requests_per_s": round(len(values) / took, 1),
        "p50_ms": round(statistics.median(values) * 1000, 3),
        "p99_ms": round(values[min(len(values) - 1, int(len(values) * 0.99))] * 1000, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="per server and concurrency")
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for name, (module, run) in CANDIDATES.items():
        try:
            __import__(module)
        except ImportError:
            print(f"{name}: not installed, skipped", file=sys.stderr)
            continue
        port = free_port()
        with run(port):
            drive(port, 1, 0.3)  # warm up
            for clients in (1, 8):
                figures = drive(port, clients, args.seconds)
                results[f"{name}/c{clients}"] = figures
                if not args.json:
                    print(f"{name:<18} {clients} client(s): {figures}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
