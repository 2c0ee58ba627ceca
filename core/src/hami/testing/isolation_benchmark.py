"""The isolation-library overhead benchmark every vendor runs: what its library adds to the calls of its API, and
how fast a container's processes start, measured with its isolation tests' fakes and client.

A vendor's benchmark script names its isolation tests' setup (the `IsolationSetup` of their ``conftest.py``, read by
`load_setup`) and what is its own (the allocate+free pairs its client times), then calls `main`. The driver builds
the fakes and the client with hami.testing.sandbox, then times, in the client (best of 7 rounds, best of 3
processes), each call against the fakes alone and with the installed library preloaded:

- each allocate+free pair of 1 MiB, under a memory limit (the fakes keep no host memory behind allocations, so that
  the fake's own cost stays small and steady);
- a launch without a compute limit, and with one (the fake kernel takes no time, so the limiter never waits: this
  is its bookkeeping cost);
- a memory-info query, under a memory limit;
- N processes of one container started at once, each initializing (its slot, an allocation refused over the
  limit, one allocated): wall time until all have exited.

It prints one line per figure and, last, one JSON object. A benchmark, not a test: nothing is asserted. Nothing here
names a vendor.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hami.testing.sandbox import Build, IsolationSetup, SandboxError, prepare

__all__ = ["AllocationPair", "OverheadBenchmark", "load_setup", "main", "run"]

# DESIGN.md's budgets: an allocate+free pair <= 300 ns, launch <= 15 ns, limited launch <= 30 ns, memory info <=
# 100 ns, 200 processes <= 2 s.
PAIR_BUDGET_NS = 300
BUDGETS = {
    "launch_overhead_ns": 15,
    "launch_overhead_limited_ns": 30,
    "meminfo_overhead_ns": 100,
    "startup_200_procs_s": 2,
}
STARTUP_LIMIT = 1 << 20


@dataclass(frozen=True)
class AllocationPair:
    """One allocate+free pair the client times (``client bench <call> N``)."""

    figure: str  # the figure's name, e.g. "alloc_free_overhead_ns"
    call: str  # the client's bench argument
    label: str  # how the baseline line names it, e.g. "alloc+free"


@dataclass(frozen=True)
class OverheadBenchmark:
    """One vendor's benchmark: its isolation tests' setup and the pairs its client times."""

    setup: IsolationSetup
    pairs: tuple[AllocationPair, ...]
    baseline: str  # what the fakes alone are called in the baseline line, e.g. "fake driver alone"


def load_setup(conftest: Path) -> IsolationSetup:
    """The SETUP of a vendor's isolation tests, from their conftest.py (imported by path, as pytest would)."""
    spec = importlib.util.spec_from_file_location("hami_isolation_setup", conftest)
    if spec is None or spec.loader is None:
        raise SandboxError(f"cannot import {conftest}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    setup = getattr(module, "SETUP", None)
    if not isinstance(setup, IsolationSetup):
        raise SandboxError(f"{conftest} has no SETUP (a hami.testing.sandbox.IsolationSetup)")
    return setup


def environment(build: Build, preload: bool, **extra: str) -> dict[str, str]:
    """This process's environment without the library's and the fakes' variables, then the benchmark's."""
    setup = build.setup
    # the library's variables: every one that starts with the first word of a variable the setup names
    names = (setup.memory_limit_variable, setup.core_limit_variable, setup.accounting_variable)
    own = ("HAMI_", setup.fake_prefix, *{f"{name.split('_', 1)[0]}_" for name in (*names, setup.log_level_variable)})
    env = {k: v for k, v in os.environ.items() if not k.startswith(own) and k != "LD_PRELOAD"}
    env.update({"LD_LIBRARY_PATH": str(build.directory), f"{setup.fake_prefix}NO_BACKING": "1"})
    env[setup.log_level_variable] = "0"
    env[setup.accounting_variable] = str(build.output / f"bench-{os.getpid()}-{len(extra)}.cache")
    if preload:
        env["LD_PRELOAD"] = str(build.library)
    env.update(extra)
    return env


def per_call_ns(client: Path, what: str, rounds: int, env: Mapping[str, str]) -> float:
    best = float("inf")
    for _ in range(3):
        out = subprocess.run(
            [str(client), "bench", what, str(rounds)], env=dict(env), capture_output=True, text=True, check=True
        )
        best = min(best, float(json.loads(out.stdout.strip().splitlines()[-1])["ns"]))
    return best


def startup_seconds(client: Path, count: int, env: Mapping[str, str]) -> tuple[float, int]:
    argv = [str(client), "spawn", str(count), "--", str(client), "init", str(STARTUP_LIMIT)]
    out = subprocess.run(argv, env=dict(env), capture_output=True, text=True, check=True, timeout=600)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return float(result["seconds"]), int(result["failed"])


def run(
    benchmark: OverheadBenchmark, build: Build, rounds: int, processes: int
) -> tuple[dict[str, float], dict[str, float]]:
    """The figures (overheads over the fakes alone, start-up), and the fakes' own per-call times by client call."""
    setup = build.setup
    limits = {setup.memory_limit_variable: "8g"}
    bare, hooked = environment(build, False), environment(build, True, **limits)
    limited = environment(build, True, **{setup.core_limit_variable: "50"}, **limits)
    calls = [
        *((pair.figure, pair.call, hooked) for pair in benchmark.pairs),
        ("launch_overhead_ns", "launch", environment(build, True)),
        ("launch_overhead_limited_ns", "launch", limited),
        ("meminfo_overhead_ns", "meminfo", hooked),
    ]
    figures: dict[str, float] = {}
    raw: dict[str, float] = {}
    for key, what, env in calls:
        if what not in raw:
            raw[what] = per_call_ns(build.client, what, rounds, bare)
        figures[key] = round(max(0.0, per_call_ns(build.client, what, rounds, env) - raw[what]), 1)
    container = environment(build, True, **{setup.memory_limit_variable: str(STARTUP_LIMIT)})
    seconds, failed = startup_seconds(build.client, processes, container)
    figures[f"startup_{processes}_procs_s"] = round(seconds, 3)
    figures["startup_failed"] = failed
    return figures, raw


def main(benchmark: OverheadBenchmark, description: str | None) -> None:
    """The command line of a vendor's benchmark script: [--rounds N] [--processes N] [--json]."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200_000, help="calls per timed round")
    parser.add_argument("--processes", type=int, default=200, help="processes started at once")
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="hami-isolation-bench-") as tmp:
        try:
            build = prepare(benchmark.setup, Path(tmp))
        except SandboxError as e:
            sys.exit(str(e))
        figures, raw = run(benchmark, build, args.rounds, args.processes)

    if not args.json:
        pairs = ", ".join(f"{pair.label} {raw[pair.call]:.1f} ns" for pair in benchmark.pairs)
        print(f"{benchmark.baseline}: {pairs}, launch {raw['launch']:.1f} ns, memory info {raw['meminfo']:.1f} ns")
        budgets = {**dict.fromkeys((pair.figure for pair in benchmark.pairs), PAIR_BUDGET_NS), **BUDGETS}
        for key, value in figures.items():
            budget = budgets.get(key)
            note = f"  (budget {budget})" if budget is not None else ""
            print(f"{key:<30} {value}{note}")
    print(json.dumps(figures))
