"""The CPU the HTTP front (`hami.front`) spends on one request, the app's own work left out.

    python benchmarks/front_cpu.py                  # 4,000 requests, a 200-node filter body each
    python benchmarks/front_cpu.py --nodes 1000 --requests 2000

Serves an app that answers at once (every other request on the event loop through `quick`, as the extender answers
a filter; the others in a worker thread, as it answers a bind) and drives it from another process over one
keep-alive connection, as kube-scheduler does. Prints the server process's CPU microseconds per request (user and
system, from getrusage: the client is not counted) and the client's wall time per request; the last line is one
JSON object. Compare two trees by running it in each, alternated: on a shared machine only pairs mean anything.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import resource
import time
from multiprocessing.queues import Queue
from typing import Any

from hami.front import JsonServer


class _App:
    def handle(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        return 200, {"Error": ""}

    def quick(self, method: str, path: str, body: bytes) -> tuple[int, Any] | None:
        if path != "/filter":
            return None
        return 200, {"NodeNames": ["node-00001"], "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}


def _client(port: int, body: bytes, requests: int, done: Queue[float]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    started = time.perf_counter()
    for i in range(requests):
        path = "/filter" if i % 2 == 0 else "/bind"
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        conn.getresponse().read()
    done.put(time.perf_counter() - started)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--nodes", type=int, default=200, help="node names in each body")
    args = parser.parse_args()
    body = json.dumps(
        {
            "Pod": {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {"containers": []}},
            "NodeNames": [f"node-{i:05d}" for i in range(args.nodes)],
        }
    ).encode()
    server = JsonServer(_App(), ("127.0.0.1", 0)).start()
    context = multiprocessing.get_context("spawn")
    done: Queue[float] = context.Queue()
    try:
        warm = context.Process(target=_client, args=(server.port, body, 200, done))
        warm.start()
        warm.join()
        done.get()
        before = _cpu()
        client = context.Process(target=_client, args=(server.port, body, args.requests, done))
        client.start()
        client.join()
        wall = done.get()
        cpu = _cpu() - before
    finally:
        server.stop()
    result = {
        "requests": args.requests,
        "body_bytes": len(body),
        "server_cpu_us_per_request": round(1e6 * cpu / args.requests, 1),
        "client_wall_us_per_request": round(1e6 * wall / args.requests, 1),
    }
    for key, value in result.items():
        print(f"{key:<28} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
