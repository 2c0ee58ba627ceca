"""`hami simulate`: replay an openb trace through the scheduler under one or more policies.

Owns the command's flags and the run: read the traces, sample once (every policy gets the same pods), run
each policy, print the table (or the JSON line), then write the plot, whose path was checked before the run.
"""

from __future__ import annotations

import argparse
import time

from hami.errors import ConfigError
from hami.simulate.engine import POLICIES, simulate, workload_of
from hami.simulate.report import Progress, as_json, check_plot_path, dump, plot, table
from hami.simulate.trace import SAMPLING, read_nodes, read_pods, sample_pods
from hami.validation import nearest

__all__ = ["add_simulate_parser"]


def add_simulate_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "simulate",
        help="replay a workload trace through the scheduler and measure how much GPU stays unallocated",
        description="Replay an openb trace (Alibaba cluster-trace-gpu-v2023) through the scheduler's own filter "
        "and policies on an in-memory cluster, as the FGD paper's method: the trace's pods shuffled and topped up "
        "with pods drawn with replacement until their GPU request reaches TUNE x capacity, scheduled one by one, "
        "no departures.",
        epilog=(
            "Examples:\n"
            "  hami simulate --nodes openb_node_list_gpu_node.csv --pods openb_pod_list_default.csv\n"
            "  hami simulate --nodes N.csv --pods P.csv --policy binpack,fragmentation-aware --plot out.png\n"
            "  hami simulate --list-policies"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", metavar="CSV", help="node list (sn,cpu_milli,memory_mib,gpu,model)")
    parser.add_argument("--pods", metavar="CSV", help="pod list (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,...])")
    parser.add_argument(
        "--policy", default="fragmentation-aware", help="a policy or a comma list (default fragmentation-aware)"
    )
    parser.add_argument("--seed", type=int, default=42, help="sampling seed (default 42)")
    parser.add_argument("--tune", type=float, default=1.3, help="workload to sample, x GPU capacity (default 1.3)")
    parser.add_argument(
        "--sampling",
        choices=SAMPLING,
        default=SAMPLING[0],
        help="top-up: the trace's pods shuffled, then random draws up to TUNE (the FGD authors' simulator; default); "
        "resample: only random draws",
    )
    parser.add_argument(
        "--workload",
        choices=("trace", "learned"),
        default="trace",
        help="what fragmentation-aware plans for: the trace's mix (default), or, as the live extender, the mix of "
        "the requests filtered so far",
    )
    parser.add_argument(
        "--usage",
        action="store_true",
        help="replay a usage trace synthesised from the pods' QoS classes (hami.simulate.usage) and report how "
        "latency-sensitive pods end up beside busy ones (always on for the usage policy)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--plot", metavar="PNG", help="write unallocated %% against arrived workload as a PNG")
    parser.add_argument("--list-policies", action="store_true", help="print the policy names, one per line")
    parser.set_defaults(func=run_simulate)
    return parser


def run_simulate(args: argparse.Namespace) -> int:
    if args.list_policies:
        print("\n".join(POLICIES))
        return 0
    if not args.nodes or not args.pods:
        raise ConfigError("hami simulate: give --nodes and --pods (or --list-policies)")
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        near = [n for n in (nearest(p, list(POLICIES)) for p in unknown) if n]
        hint = f" (did you mean {', '.join(map(repr, near))}?)" if near else ""
        raise ConfigError(
            f"hami simulate: --policy: unknown policy {', '.join(unknown) or '(none)'}; known: "
            f"{', '.join(POLICIES)}{hint}"
        )
    if args.tune <= 0:
        raise ConfigError("hami simulate: --tune must be positive")
    if args.plot:
        check_plot_path(args.plot)
    started = time.perf_counter()
    nodes = read_nodes(args.nodes)
    pods = read_pods(args.pods)
    sampled = sample_pods(pods, sum(n.gpus for n in nodes), args.tune, args.seed, args.sampling)
    workload = workload_of(pods)
    results = [
        simulate(
            nodes,
            sampled,
            policy,
            seed=args.seed,
            workload=workload,
            learn=args.workload == "learned",
            progress=Progress(policy),
            usage=args.usage,
        )
        for policy in policies
    ]
    if args.json:
        dump(as_json(results, time.perf_counter() - started))
    else:
        print(table(results))
        elapsed = time.perf_counter() - started
        print(f"{len(sampled)} pods sampled from {len(pods)} onto {len(nodes)} nodes; {elapsed:.1f} s", flush=True)
    if args.plot:
        plot(results, args.plot)
    return 0
