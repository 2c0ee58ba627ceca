"""The scheduler's HTTP front as hostile clients meet it: the measurements of issue #23, repeatable.

    python benchmarks/hostile_clients.py [--bodies 10000] [--slow 200] [--seconds 30] [--body-mb 60]

Starts a scheduler (in-memory cluster, the real service, extender and metrics servers; decisions recorded as
`hami scheduler` records them, with the bind, or with `--no-at-bind` before the filter answers) in a process of
its own and drives it from this one:

1. `--bodies` generated extender bodies (valid bodies with random parts replaced by the wrong type, by lone
   surrogates and other invalid text, keys removed, bytes spliced in; pods the extender places and then cannot
   record), counted by answer; then the scheduler's state (assumptions, host usage, quota, node locks) compared
   with the state before, eight filters of a pod named `p1\\ud800` (which once filled the 8-GPU node), and
   `/metrics`;
2. `--slow` connections that send a header byte a second (and some that send nothing), counted open after
   the header deadline and at the end of `--seconds`, while a normal client is served;
3. 200 connections opened at once (each answered?, the slowest) and 50 busy keep-alive clients for 10 s
   (errors, resets);
4. a `--body-mb` NodeList body: the server's peak resident memory above what it held before;
5. a `--body-mb` filter body whose node names are `{},` repeated, then four `--parallel-mb` (16) MB ones at
   once: the server's peak resident memory above what it held before (per body byte in flight) and its
   resident memory once all are answered, against before (`--only braces` for these alone);
6. 40 connections sending only headers that announce 67 MB bodies: the server's resident memory.

Prints one line per figure and a JSON object last.
"""

from __future__ import annotations

import argparse
import copy
import http.client
import json
import random
import select
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from scheduler_harness import post_raw as post  # noqa: E402

# ------------------------------------------------------------------------------------------------ the server


def serve(at_bind: bool) -> None:
    """The scheduler under test: answers `snapshot`, `reset` and `memory` on stdin, one JSON line each."""
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from scheduler_harness import Harness, gpu_node, gpu_pod

    from hami.cluster import meta
    from hami.cluster.locks import LOCK_ANNOTATION
    from hami.lifecycle import BIND_PHASE
    from hami.scheduler.extender import ExtenderSettings

    h = Harness(settings=ExtenderSettings(bind_lock_wait_seconds=0.5, record_at_bind=at_bind))
    h.add_node(gpu_node("node-a", gpus=8, memory=16000, split=1))
    h.add_node(gpu_node("node-b", gpus=8, memory=16000, split=4))
    h.add_pod(gpu_pod("running", mem=3000))
    h.start()
    h.filter("running")
    h.flush()
    assert h.service is not None
    assert h.server is not None
    metrics = h.service.metrics.serve_metrics(("127.0.0.1", 0))
    print(json.dumps({"extender": h.server.port, "metrics": metrics.port}), flush=True)

    def snapshot() -> Any:
        assert h.service is not None
        h.flush()
        state = h.service.extender.state
        with state.lock:
            pods = sorted([k, r.node, r.assumed, r.bound] for k, r in state.pods.items())
            hosts = sorted([k, list(v)] for k, v in state.cpu_memory.items())
        locks = sorted(
            [meta(n)["name"], (meta(n).get("annotations") or {}).get(LOCK_ANNOTATION)]
            for n in h.cluster.list("nodes")[0]
        )
        ledger = h.service.ledger
        with ledger._lock:
            usage = sorted([ns, sorted(p)] for ns, p in ledger._usage.items())
        phases = sorted(
            [meta(p)["name"], (meta(p).get("annotations") or {}).get(BIND_PHASE)] for p in h.cluster.list("pods")[0]
        )
        return {"pods": pods, "hosts": hosts, "locks": locks, "quota": usage, "bind_phases": phases}

    def memory() -> dict[str, int]:
        fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
        return {k: int(fields[k].split()[0]) for k in ("VmRSS", "VmHWM")}

    for line in sys.stdin:
        command = line.strip()
        if command == "snapshot":
            print(json.dumps(snapshot()), flush=True)
        elif command == "reset":  # the peak resident size starts again from the current one
            Path("/proc/self/clear_refs").write_text("5")
            print(json.dumps(memory()), flush=True)
        elif command == "memory":
            print(json.dumps(memory()), flush=True)
    metrics.stop()
    h.stop()


class Server:
    def __init__(self, *, at_bind: bool = True) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve", *(["--at-bind"] if at_bind else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        ports = json.loads(self.process.stdout.readline())
        self.extender, self.metrics = int(ports["extender"]), int(ports["metrics"])

    def ask(self, command: str) -> Any:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(60)


# ------------------------------------------------------------------------------------------------ bodies

HOSTILE: list[Any] = [
    ["x"], "x", "", 1, -1, 0, 10**30, 1.5e308, -0.0, None, True, False, {}, [], {"a": ["b"]}, [[[[]]]],
    "p1\ud800", "\udc00", "\udfff\ud800", "a\x00b", "../x", "x" * 300, "é", "A", "1Gi", "-1", "1e400",
]  # fmt: skip
SPLICES = [b"\xff", b"\xed\xa0\x80", b"\\ud800", b"\\udfff\\ud800", b"\x00", b'"', b"}", b"\xc0\xaf", b"\\u0000"]


def base_filter(rng: random.Random) -> dict[str, Any]:
    name = "".join(rng.choice("abcdefghij") for _ in range(6))
    limits = {"nvidia.com/gpu": rng.choice(["1", "2"]), "nvidia.com/gpumem": rng.choice(["1000", "3000"])}
    return {
        "Pod": {
            "metadata": {"name": name, "namespace": "default", "uid": name, "annotations": {"a": "b"}, "labels": {}},
            "spec": {
                "schedulerName": "hami-scheduler",
                "containers": [
                    {"name": "c", "resources": {"limits": limits}, "env": [{"name": "E", "value": "v"}]},
                ],
                "initContainers": [],
            },
        },
        "NodeNames": rng.choice([["node-a"], ["node-a", "node-b"], ["node-b"]]),
    }


def base_bind(rng: random.Random) -> dict[str, Any]:
    return {
        "PodName": rng.choice(["running", "nothere"]),
        "PodNamespace": "default",
        "PodUID": "u",
        "Node": rng.choice(["node-a", "node-b"]),
    }


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += paths(item, (*prefix, i))
    return found


def mutate(rng: random.Random, body: Any) -> Any:
    body = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        where = rng.choice(paths(body))
        if not where:
            if rng.random() < 0.05:
                body = copy.deepcopy(rng.choice(HOSTILE))
            continue
        parent = body
        for part in where[:-1]:
            parent = parent[part]
        last = where[-1]
        roll = rng.random()
        if roll < 0.15 and isinstance(parent, dict):
            del parent[last]
        elif roll < 0.25 and isinstance(parent, dict):
            parent[rng.choice(HOSTILE[16:])] = copy.deepcopy(rng.choice(HOSTILE))  # a key of invalid text
        else:
            parent[last] = copy.deepcopy(rng.choice(HOSTILE))
    return body


def generate(rng: random.Random) -> tuple[str, bytes]:
    verb = rng.choice(["filter", "prioritize", "bind"])
    body: Any = base_bind(rng) if verb == "bind" else base_filter(rng)
    if rng.random() < 0.85:
        body = mutate(rng, body)
    data = json.dumps(body).encode()
    if rng.random() < 0.2:
        at = rng.randint(0, len(data))
        data = data[:at] + rng.choice(SPLICES) + data[at:]
    return verb, data


def fuzz(server: Server, count: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    before = server.ask("snapshot")
    answers: Counter[str] = Counter()
    fives: list[str] = []
    connection = http.client.HTTPConnection("127.0.0.1", server.extender, timeout=30)
    started = time.monotonic()
    for _ in range(count):
        verb, data = generate(rng)
        connection.request("POST", f"/{verb}", data, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        payload = answer.read()
        answers[f"{verb} {answer.status}"] += 1
        if answer.status >= 500:
            fives.append(f"{verb} {data[:200]!r} -> {payload[:200]!r}")
        if answer.getheader("connection", "").lower() == "close":
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", server.extender, timeout=30)
    elapsed = time.monotonic() - started
    connection.close()
    after = server.ask("snapshot")
    surrogate = (
        b'{"Pod": {"metadata": {"name": "p1\\ud800", "namespace": "default"}, "spec": {"containers": '
        b'[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}, "NodeNames": ["node-a"]}'
    )
    surrogate_answers = Counter(post(server.extender, "/filter", surrogate)[0] for _ in range(8))
    bind = b'{"PodName": "running", "PodNamespace": "default", "PodUID": "u", "Node": "node-\\ud800"}'
    surrogate_answers[post(server.extender, "/bind", bind)[0]] += 1
    after_surrogates = server.ask("snapshot")
    metrics = post(server.metrics, "/metrics", b"", "GET")[0]
    return {
        "bodies": count,
        "seconds": round(elapsed, 1),
        "answers": dict(sorted(answers.items())),
        "5xx": len(fives),
        "5xx_examples": fives[:5],
        "state_unchanged": before == after,
        "state_changes": {k: [before[k], after[k]] for k in before if before[k] != after[k]},
        "surrogate_answers": dict(surrogate_answers),
        "state_unchanged_after_surrogates": before == after_surrogates,
        "metrics_status": metrics,
    }


# ------------------------------------------------------------------------------------------------ connections


def slow_senders(server: Server, count: int, seconds: float) -> dict[str, Any]:
    sockets: list[socket.socket] = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", server.extender), timeout=10)
        sock.setblocking(False)
        sockets.append(sock)
        if i % 10 != 0:  # one in ten sends nothing at all
            sock.send(b"P")
    request = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 999999\r\nX-Slow: " + b"a" * 10_000
    sent = dict.fromkeys(range(count), 1)
    closed_at: dict[int, float] = {}
    started = time.monotonic()
    served_meanwhile: list[int] = []
    counts: dict[str, int] = {}
    next_tick = started
    while time.monotonic() - started < seconds:
        now = time.monotonic()
        if now >= next_tick:
            next_tick += 1.0
            for i, sock in enumerate(sockets):
                if i in closed_at or i % 10 == 0:
                    continue
                try:
                    sock.send(request[sent[i] : sent[i] + 1])
                    sent[i] += 1
                except OSError:
                    closed_at[i] = now - started
            if not served_meanwhile or int(now - started) % 5 == 0:
                served_meanwhile.append(post(server.extender, "/healthz", b"", "GET", timeout=5)[0])
        readable, _, _ = select.select([s for i, s in enumerate(sockets) if i not in closed_at], [], [], 0.1)
        for sock in readable:
            i = sockets.index(sock)
            try:
                if sock.recv(4096) == b"":
                    closed_at[i] = time.monotonic() - started
            except OSError:
                closed_at[i] = time.monotonic() - started
        elapsed = time.monotonic() - started
        for mark in (5.0, 12.0):
            key = f"open_after_{mark:.0f}s"
            if elapsed >= mark and key not in counts:
                counts[key] = count - len(closed_at)
    for sock in sockets:
        sock.close()
    return {
        "slow_connections": count,
        **counts,
        f"open_after_{seconds:.0f}s": count - len(closed_at),
        "closed_within_s": round(max(closed_at.values()), 1) if closed_at else None,
        "others_served": served_meanwhile,
    }


def simultaneous(server: Server, count: int = 200) -> dict[str, Any]:
    gate = threading.Barrier(count)
    results: list[tuple[int, float]] = []
    failures: list[str] = []
    lock = threading.Lock()

    def client() -> None:
        gate.wait()
        started = time.monotonic()
        try:
            status = post(server.extender, "/healthz", b"", "GET")[0]
        except OSError as exc:
            with lock:
                failures.append(repr(exc))
            return
        with lock:
            results.append((status, time.monotonic() - started))

    threads = [threading.Thread(target=client) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return {
        "simultaneous": count,
        "answered_200": sum(1 for s, _ in results if s == 200),
        "failures": failures[:5],
        "slowest_s": round(max((d for _, d in results), default=0.0), 3),
    }


def busy(server: Server, clients: int = 50, seconds: float = 10) -> dict[str, Any]:
    body = json.dumps(
        {
            "Pod": {"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": []}},
            "NodeNames": ["node-a"],
        }
    ).encode()
    done: Counter[str] = Counter()
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", server.extender, timeout=30)
        while time.monotonic() < end:
            try:
                connection.request("POST", "/filter", body, {"Content-Type": "application/json"})
                answer = connection.getresponse()
                answer.read()
                outcome = str(answer.status)
            except (OSError, http.client.HTTPException) as exc:
                outcome = type(exc).__name__
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", server.extender, timeout=30)
            with lock:
                done[outcome] += 1
        connection.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    return {"busy_clients": clients, "outcomes": dict(done)}


def large_body(server: Server, megabytes: float) -> dict[str, Any]:
    """A NodeList of full-looking nodes (status fields the extender does not read) of about `megabytes` MB."""
    pad = "x" * 60_000
    items = [
        {"metadata": {"name": f"node-{i}", "labels": {"l": pad[:1000]}}, "status": {"images": [pad]}}
        for i in range(int(megabytes * 1_000_000 // 61_100))
    ]
    body = json.dumps(
        {
            "Pod": {"metadata": {"name": "big", "namespace": "default"}, "spec": {"containers": []}},
            "Nodes": {"items": items},
        }
    ).encode()
    del items
    before = server.ask("reset")
    status = post(server.extender, "/filter", body, timeout=120)[0]
    after = server.ask("memory")
    peak = (after["VmHWM"] - before["VmRSS"]) * 1024
    return {
        "body_mb": round(len(body) / 1e6, 1),
        "status": status,
        "rss_before_mb": round(before["VmRSS"] / 1024),
        "peak_above_before_mb": round(peak / 1e6),
        "peak_per_body_byte": round(peak / len(body), 2),
    }


def braces_body(megabytes: float) -> bytes:
    """A filter body of about `megabytes` MB whose node names are `{}` repeated: cheap to send, and each `{}` an
    object to a parser that builds generic objects before the typed model."""
    head = b'{"Pod":{"metadata":{"name":"big","namespace":"default"},"spec":{"containers":[]}},"NodeNames":['
    count = max(1, int(megabytes * 1_000_000 - len(head) - 2) // 3)
    return head + b"{}," * (count - 1) + b"{}]}"


def braces(server: Server, megabytes: float, parallel: int) -> dict[str, Any]:
    """`parallel` `{},`-repeated bodies of `megabytes` MB each at once: the server's peak resident memory above
    what it held before (per byte of the bodies in flight), and what it holds once all are answered."""
    body = braces_body(megabytes)
    before = server.ask("reset")
    statuses: list[int] = []

    def send() -> None:
        statuses.append(post(server.extender, "/filter", body, timeout=300)[0])

    threads = [threading.Thread(target=send) for _ in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    time.sleep(1.0)
    after = server.ask("memory")
    peak = (after["VmHWM"] - before["VmRSS"]) * 1024
    return {
        "body_mb": round(len(body) / 1e6, 1),
        "parallel": parallel,
        "statuses": sorted(statuses),
        "rss_before_mb": round(before["VmRSS"] / 1024),
        "peak_above_before_mb": round(peak / 1e6),
        "peak_per_body_byte": round(peak / (parallel * len(body)), 2),
        "rss_after_mb": round(after["VmRSS"] / 1024),
        "rss_after_over_before": round(after["VmRSS"] / before["VmRSS"], 3),
    }


def announced(server: Server, count: int = 40, megabytes: int = 67) -> dict[str, Any]:
    """Connections that send headers announcing large bodies, and one byte of them."""
    before = server.ask("reset")
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", server.extender), timeout=10)
        sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{" % (megabytes * 1_000_000))
        sockets.append(sock)
    time.sleep(2)
    after = server.ask("memory")
    served = post(server.extender, "/healthz", b"", "GET", timeout=10)[0]
    for sock in sockets:
        sock.close()
    return {
        "announcing_connections": count,
        "announced_mb_each": megabytes,
        "rss_before_mb": round(before["VmRSS"] / 1024),
        "rss_after_mb": round(after["VmRSS"] / 1024),
        "others_served": served,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--at-bind",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="record decisions with the bind, as `hami scheduler` does (--no-at-bind: before the filter answers)",
    )
    parser.add_argument("--bodies", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--slow", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--body-mb", type=float, default=60)
    parser.add_argument("--parallel-mb", type=float, default=16, help="each of the four {}-repeated bodies at once")
    parser.add_argument("--only", default="fuzz,slow,connect,busy,body,braces,announce", help="comma-separated parts")
    args = parser.parse_args()
    if args.serve:
        serve(args.at_bind)
        return
    parts = set(args.only.split(","))
    server = Server(at_bind=args.at_bind)
    report: dict[str, Any] = {}
    try:
        if "fuzz" in parts:
            report["fuzz"] = fuzz(server, args.bodies, args.seed)
            print("fuzz:", report["fuzz"], flush=True)
        if "slow" in parts:
            report["slow"] = slow_senders(server, args.slow, args.seconds)
            print("slow senders:", report["slow"], flush=True)
        if "connect" in parts:
            report["connect"] = simultaneous(server)
            print("simultaneous connects:", report["connect"], flush=True)
        if "busy" in parts:
            report["busy"] = busy(server)
            print("busy clients:", report["busy"], flush=True)
        if "body" in parts:
            report["body"] = large_body(server, args.body_mb)
            print("large body:", report["body"], flush=True)
        if "braces" in parts:
            report["braces"] = braces(server, args.body_mb, 1)
            print("{}-repeated body:", report["braces"], flush=True)
            report["braces_parallel"] = braces(server, args.parallel_mb, 4)
            print("{}-repeated bodies, four at once:", report["braces_parallel"], flush=True)
        if "announce" in parts:
            report["announce"] = announced(server)
            print("announced bodies:", report["announce"], flush=True)
    finally:
        server.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
