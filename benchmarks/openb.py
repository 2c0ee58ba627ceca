"""Scheduling quality on the openb traces, every policy, next to the FGD paper's published numbers.

    python benchmarks/openb.py --data ../shared/data/openb --seeds 10 --json
    python benchmarks/openb.py --data DIR --traces default,gpushare40 --policies fragmentation-aware --seeds 3

Runs `hami simulate`'s engine for each trace, policy and seed (seeds 42, 43, ...: the paper's), in parallel
worker processes, and prints per trace and policy the median unallocated GPU % at 100 % and 130 % arrived
workload, with the paper's FGD and BestFit medians for the same trace when `--published` points at their
result files (default: ../data/fgd-results beside the data folder). Progress goes to stderr; the last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from hami.simulate.engine import POLICIES, simulate, workload_of
from hami.simulate.trace import SAMPLING, read_nodes, read_pods, sample_pods

TRACES = (
    "default",
    "cpu050", "cpu100", "cpu200", "cpu250",
    "gpushare40", "gpushare60", "gpushare80", "gpushare100",
    "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
    "multigpu20", "multigpu30", "multigpu40", "multigpu50",
)  # fmt: skip
PAPER_POLICIES = {"06-FGD": "FGD", "05-BestFit": "BestFit", "04-GpuPacking": "GpuPacking"}


def run_one(
    data: str, trace: str, policy: str, seed: int, tune: float, sampling: str, learn: bool
) -> tuple[str, str, int, dict[int, float], float]:
    nodes = read_nodes(Path(data) / "openb_node_list_gpu_node.csv")
    pods = read_pods(Path(data) / f"openb_pod_list_{trace}.csv")
    sampled = sample_pods(pods, sum(n.gpus for n in nodes), tune, seed, sampling)
    result = simulate(nodes, sampled, policy, seed=seed, workload=workload_of(pods), learn=learn)
    return trace, policy, seed, result.unallocated_pct, result.seconds


def published(path: Path) -> dict[tuple[str, str], dict[str, float]]:
    """(trace, policy) → median unallocated % at 100 and 130 from the paper authors' per-seed results."""
    file = path / "analysis_allo_discrete.csv"
    if not file.exists():
        return {}
    runs: dict[tuple[str, str], dict[str, list[float]]] = {}
    with file.open(newline="") as handle:
        for row in csv.DictReader(handle):
            name = PAPER_POLICIES.get(row["sc_policy"])
            if name is None:
                continue
            trace = row["workload"].removeprefix("openb_pod_list_")
            for mark in ("100", "130"):
                runs.setdefault((trace, name), {}).setdefault(mark, []).append(100 - float(row[mark]))
    return {key: {m: round(statistics.median(v), 2) for m, v in marks.items()} for key, marks in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="folder of the openb CSV files")
    parser.add_argument("--published", help="folder of the FGD authors' results (default: ../fgd-results)")
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--tune", type=float, default=1.3)
    parser.add_argument("--sampling", choices=SAMPLING, default=SAMPLING[0], help="as `hami simulate --sampling`")
    parser.add_argument(
        "--workload", choices=("trace", "learned"), default="trace", help="as `hami simulate --workload`"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()

    traces = [t.strip() for t in args.traces.split(",") if t.strip()]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    paper = published(Path(args.published) if args.published else Path(args.data).parent / "fgd-results")
    jobs = [(t, p, 42 + s) for t in traces for p in policies for s in range(args.seeds)]
    results: dict[tuple[str, str], list[dict[int, float]]] = {}
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [
            pool.submit(run_one, args.data, t, p, s, args.tune, args.sampling, args.workload == "learned")
            for t, p, s in jobs
        ]
        for done, future in enumerate(as_completed(futures), start=1):
            trace, policy, seed, curve, seconds = future.result()
            results.setdefault((trace, policy), []).append(curve)
            print(f"[{done}/{len(jobs)}] {trace} {policy} seed {seed}: {curve.get(100)} % at 100 ({seconds:.0f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip

    summary: dict[str, dict[str, dict[str, float | None]]] = {}
    for trace in traces:
        for policy in policies:
            curves = results.get((trace, policy), [])
            summary.setdefault(trace, {})[policy] = {
                mark: round(statistics.median(c[int(mark)] for c in curves), 2) if curves else None
                for mark in ("100", "130")
            }
        for name in PAPER_POLICIES.values():
            if (trace, name) in paper:
                summary[trace][f"paper {name}"] = dict(paper[(trace, name)])
    if not args.json:
        columns = [*policies, *(f"paper {n}" for n in PAPER_POLICIES.values())]
        print("median unallocated GPU % at 100 % arrived (130 % in brackets)")
        print(f"{'trace':<12}" + "".join(f"{c:>24}" for c in columns))
        for trace, row in summary.items():
            cells = []
            for column in columns:
                value = row.get(column)
                cells.append(
                    f"{value['100']:>14} ({value['130']})" if value and value["100"] is not None else f"{'-':>24}"
                )
            print(f"{trace:<12}" + "".join(f"{c:>24}" for c in cells))
    print(json.dumps({"seeds": args.seeds, "seconds": round(time.perf_counter() - started, 1), "traces": summary}))


if __name__ == "__main__":
    main()
