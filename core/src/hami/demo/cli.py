"""`hami demo`: its flags, the run, and what it prints (`add_demo_parser`; `hami.cli` registers it).

Text mode prints, as it goes: the components and their addresses, then per example pod its file, where it
went (node, devices with memory and cores), the env its containers get, or the step that refused it and
why; at the end the per-device table of `hami status`, the metrics URLs and how to look further.
`--json` prints one JSON object on the last line instead (every pod's `PodOutcome`, the status, the URLs).
`--keep` leaves everything running until Ctrl-C, for a look at the metrics or `hami status`.

Exit status: 0 when the demo ran to the end, whatever became of each pod (that is in the output, and in the
JSON for scripts); 2 when it could not run (a bad file, a component that did not start).

A pod that fails at Allocate is reported with the vendor's message, and a note at the end names the vendors
concerned and points at the inventory's `driver` facts, which stand in for what their drivers would tell.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hami.errors import ConfigError

if TYPE_CHECKING:  # the demo's machinery loads only when the command runs
    from hami.demo.journey import PodOutcome
    from hami.demo.world import DemoWorld

__all__ = ["add_demo_parser", "run_demo"]


def add_demo_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register `hami demo` on the `hami` command's subparsers; returns the new parser."""
    parser = subparsers.add_parser(
        "demo",
        help="run the whole system locally on simulated devices and submit the example pods",
        description="Start, on this machine and on loopback only, an in-memory Kubernetes API, the real scheduler "
        "extender and admission webhook, and one real node daemon per node of a simulated inventory (with a fake "
        "kubelet each); then submit every example pod the way a cluster would (admission, filter, bind, "
        "Allocate) and show where each went, what its containers get, and what was refused and why.",
        epilog=(
            "Examples:\n"
            "  hami demo                                  the examples/ of this checkout\n"
            "  hami demo --keep                           leave it running; then: hami status --kubeconfig ...\n"
            "  hami demo --inventory my-cluster.yaml      your own hardware mix (as examples/demo-inventory.yaml)\n"
            "  hami demo --json | tail -n 1 | jq .pods    for scripts"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--inventory", metavar="FILE", help="the simulated nodes and devices (default: examples/demo-inventory.yaml)"
    )
    parser.add_argument(
        "--examples", metavar="DIR", help="folder of pod specs to submit, in name order (default: examples/pods)"
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="configuration given to every component, ${HAMI_DEMO_DIR} and ${NODE_NAME} replaced "
        "(default: examples/demo-config.yaml)",
    )
    parser.add_argument(
        "--workdir", metavar="DIR", help="where configurations, certificates and logs go (default: a temporary "
        "folder, removed at the end unless --keep)"
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="leave everything running until Ctrl-C")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the last line) instead of text")
    parser.set_defaults(func=run_demo)
    return parser


def _paths(args: argparse.Namespace) -> tuple[Path, Path, Path | None]:
    from hami.demo.examples import EXAMPLES_SUBDIR, find_examples_root

    root = find_examples_root()

    def default(given: str | None, relative: str, what: str, flag: str) -> Path:
        if given:
            return Path(given)
        if root is None:
            raise ConfigError(
                f"hami demo: no examples/ folder here or beside the installed hami; give {flag} "
                f"(run it from a checkout of the repository, or point at your own {what})"
            )
        return root / relative

    inventory = default(args.inventory, "demo-inventory.yaml", "inventory", "--inventory")
    examples = default(args.examples, EXAMPLES_SUBDIR, "pod specs", "--examples")
    config = Path(args.config) if args.config else (root / "demo-config.yaml" if root is not None else None)
    if config is not None and not config.is_file():
        if args.config:
            raise ConfigError(f"hami demo: the configuration {config} does not exist")
        config = None
    return inventory, examples, config


class _Printer:
    """Text output as the demo goes; silent in --json mode. `short()` writes the work directory as
    `$HAMI_DEMO_DIR` in values that repeat it (env, mounts)."""

    def __init__(self, quiet: bool, workdir: Path) -> None:
        self.quiet = quiet
        self.workdir = str(workdir)

    def __call__(self, line: str = "") -> None:
        if not self.quiet:
            print(line, flush=True)

    def short(self, value: str) -> str:
        return value.replace(self.workdir, "$HAMI_DEMO_DIR")

    def wrapped(self, text: str, indent: str = "    ") -> None:
        """A long message on lines of a readable width, continued with `indent`."""
        self(textwrap.fill(text, width=116, subsequent_indent=indent, break_on_hyphens=False))


def run_demo(args: argparse.Namespace) -> int:
    """What `hami demo` runs."""
    from hami.demo.examples import load_examples
    from hami.demo.journey import submit
    from hami.demo.world import DemoError, DemoWorld
    from hami.node.simulated import load_inventory
    from hami.status import collect_status, render_status

    started = time.monotonic()
    inventory_path, examples_path, config_path = _paths(args)
    inventory = load_inventory(inventory_path)
    examples = load_examples(examples_path)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="hami-demo-"))
    say = _Printer(args.json, workdir.resolve())
    try:
        world = DemoWorld(
            inventory=inventory,
            inventory_path=inventory_path,
            config_text=config_path.read_text() if config_path is not None else "",
            config_source=str(config_path or "defaults"),
            setup=[obj for example in examples for obj in example.setup],
            workdir=workdir,
        )
    except ConfigError:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    pods = [pod for example in examples for pod in example.pods]
    say(f"hami demo: {len(inventory.nodes)} nodes from {inventory_path}, {len(pods)} pods from {examples_path}/")
    for node in inventory.nodes:
        kinds: dict[str, int] = {}
        for entry in node.devices:
            kinds[entry.type or entry.kind] = kinds.get(entry.type or entry.kind, 0) + entry.repeat
        say(f"  {node.name:<12} " + ", ".join(f"{n} x {t}" for t, n in kinds.items()))
    say(f"work directory ($HAMI_DEMO_DIR: configurations, certificates, logs): {workdir.resolve()}")
    say("starting the API server, the scheduler with its webhook, and a node daemon per node ...")
    outcomes: list[PodOutcome] = []
    keep_logs = False
    try:
        world.start(progress=say)
        ready = time.monotonic() - started
        _describe_world(world, say, ready)
        for pod in pods:
            outcome = submit(world, pod)
            outcomes.append(outcome)
            _print_outcome(outcome, say)
        assert world.plugins is not None
        status = collect_status(world.cluster, world.plugins)
        say()
        say("Devices after the demo (the view of `hami status`):")
        say()
        say(render_status(status))
        say()
        if args.keep:  # without --keep everything stops when the summary is printed: no address to give
            _print_urls(world, say)
        else:
            say("Metrics, the dashboard and the API stop with the demo: `hami demo --keep` keeps them up and prints")
            say("their addresses, with the kubeconfig for `hami status` and kubectl.")
        notes = _notes(world, outcomes)
        for note in notes:
            say()
            say.wrapped(note, "")
        say()
        say(f"{_summary(outcomes)}; {time.monotonic() - started:.1f} s in all.")
        if args.json:
            report = _report(world, outcomes, status.model_dump(mode="json"), started, ready, args.keep)
            print(json.dumps({**report, "notes": notes}))
            sys.stdout.flush()
        if args.keep:
            _keep_running(world, say)
    except KeyboardInterrupt:
        say("interrupted: stopping ...")
        return 130
    except DemoError:
        keep_logs = True  # the message points into the work directory
        raise
    finally:
        world.stop()
        if not args.workdir and not keep_logs:
            world.remove_workdir()
    return 0


def _describe_world(world: DemoWorld, say: _Printer, ready: float) -> None:
    assert world.api is not None  # started
    say(f"  API server   {world.api.url}  (in-memory; kubeconfig {world.kubeconfig})")
    say(f"  scheduler    {world.scheduler_url}/filter, /bind   webhook {world.webhook_url}/mutate")
    for name, side in world.nodes.items():
        resources = ", ".join(sorted(side.resources)) or "no device it can serve"
        say(f"  hami node    {name:<12} serves {resources}")
    say(f"ready in {ready:.1f} s")
    say()
    say("Each example pod now goes admission (webhook) -> create -> filter, bind (extender) -> Allocate (node daemon,")
    say("per container, as the kubelet calls it). The devices are simulated: no driver is called; what a vendor's")
    say("Allocate asks its driver comes from the inventory, and what it does on the hardware (creating a MIG")
    say("instance, say) is not done; everything else is real.")
    say()


def _print_outcome(outcome: PodOutcome, say: _Printer) -> None:
    say(f"{outcome.file}: {outcome.namespace}/{outcome.name}")
    for warning in outcome.warnings:  # as kubectl prints an admission warning
        say.wrapped(f"  Warning: {warning}", "    ")
    if outcome.outcome == "refused":
        say.wrapped(f"  REFUSED at admission: {_after_prefix(outcome.reason)}")
    elif outcome.outcome == "unschedulable":
        say("  UNSCHEDULABLE: no node fits it")
        for node, reason in sorted(outcome.failed_nodes.items()):
            say.wrapped(f"    {node}: {reason}", "      ")
        if not outcome.failed_nodes:
            say.wrapped(f"    {outcome.reason}", "      ")
    else:
        from hami.status import cores_text

        placed = [f"{d.uuid} ({d.type}) {d.memory} MiB" + (f" {cores_text(d.cores, d.cores_total)}" if d.cores else "")
                  for d in outcome.devices]  # fmt: skip
        if len(placed) == 1:
            say(f"  -> {outcome.node}: {placed[0]}")
        else:
            say(f"  -> {outcome.node}:")
            for line in placed:
                say(f"       {line}")
        for key, value in outcome.annotations.items():
            say(f"     {key}: {value}")
        if outcome.outcome == "failed":
            say.wrapped(f"  FAILED at {outcome.step}: {outcome.reason}")
        for container in dict.fromkeys([*outcome.env, *outcome.mounts, *outcome.device_nodes]):
            env = outcome.env.get(container)
            if env:
                say(f"  container {container} env:")
                for key, value in env.items():
                    say(f"    {key}={say.short(value)}")
            mounts = outcome.mounts.get(container)
            if mounts:
                paths = [say.short(m.split(" <- ", 1)[0]) for m in mounts]
                say(f"  container {container} mounts: {', '.join(paths)}")
            nodes = outcome.device_nodes.get(container)
            if nodes:
                say(f"  container {container} device nodes: {', '.join(nodes)}")
    steps = ", ".join(f"{step} {ms:.0f} ms" for step, ms in outcome.milliseconds.items())
    say(f"  ({steps})")
    say()


def _after_prefix(message: str) -> str:
    """The webhook's message without its `hami: pod x/y denied:` prefix (the pod is named above)."""
    head, sep, rest = message.partition(" denied: ")
    return rest if sep and head.startswith("hami: ") else message


def _print_urls(world: DemoWorld, say: _Printer) -> None:
    say("Metrics (Prometheus text; the hami_* families are HAMi's):")
    say(f"  scheduler    {world.scheduler_metrics_url}")
    for name, side in world.nodes.items():
        say(f"  {name:<12} {side.metrics_url}")
    say(f"Dashboard: {world.dashboard_url} (served by the scheduler; `hami dashboard --kubeconfig` serves it too)")


def _notes(world: DemoWorld, outcomes: list[PodOutcome]) -> list[str]:
    """What the reader should know about the outcomes that the simulation explains."""
    at_allocate = [o for o in outcomes if o.outcome == "failed" and o.step == "allocate"]
    if not at_allocate:
        return []
    assert world.plugins is not None  # started
    vendors = sorted({world.plugins.owner(d.kind).name for o in at_allocate for d in o.devices})
    pods = ", ".join(o.name for o in at_allocate)
    return [
        f"Note: {len(at_allocate)} pod(s) were placed but failed at Allocate ({pods}). The devices are simulated: "
        f"what the Allocate of {', '.join(vendors) or 'their vendor'} asks its driver comes from the inventory's "
        "`driver` facts (the node's log names a missing one; the vendor's README lists them). Scheduling, binding "
        "and the node lock went as on a cluster; the pods stay counted until they are deleted, as they would on "
        "a node whose Allocate fails."
    ]


def _summary(outcomes: list[PodOutcome]) -> str:
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.outcome] = counts.get(o.outcome, 0) + 1
    order = ("running", "refused", "unschedulable", "failed")
    return f"{len(outcomes)} pods: " + ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k))


def _report(
    world: DemoWorld, outcomes: list[PodOutcome], status: dict[str, Any], started: float, ready: float, keep: bool
) -> dict[str, Any]:
    return {
        "pods": [o.model_dump(mode="json") for o in outcomes],
        "summary": _summary(outcomes),
        "status": status,
        "metrics": {"scheduler": world.scheduler_metrics_url, **{n: s.metrics_url for n, s in world.nodes.items()}},
        "kubeconfig": str(world.kubeconfig) if keep else None,
        "dashboard": world.dashboard_url if keep else None,
        "ready_seconds": round(ready, 2),
        "seconds": round(time.monotonic() - started, 2),
    }


def _keep_running(world: DemoWorld, say: _Printer) -> None:
    say()
    say("Everything keeps running. In another terminal:")
    say(f"  hami status --kubeconfig {world.kubeconfig}")
    say(f"  kubectl --kubeconfig {world.kubeconfig} get nodes,pods -A")
    say(f"  curl -s {world.scheduler_metrics_url} | grep ^hami_")
    say(f"  open {world.dashboard_url} (or: hami dashboard --kubeconfig {world.kubeconfig})")
    say(f"  logs: {world.workdir / 'logs'}")
    say("Ctrl-C stops it all.")
    done = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: done.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not done.wait(0.5):
            world.check_children()  # a component that died ends the demo, with its log
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        say("stopping ...")
