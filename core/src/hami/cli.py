"""The `hami` command: one entry point for every service and tool of the project.

Owns argument parsing, logging set-up and turning deliberate errors (`hami.errors.HamiError`) into a
one-line message and exit status 2. Each subcommand's work lives in its own module; this file only wires
them. Subcommands: `vendors`, `scheduler`, `webhook` (and `webhook certs`), `node`, `simulate`.
The quickstart and everyday tools: `demo` (`hami.demo`), `status` (`hami.status`), `config check`
(`hami.configcheck`), `completion`, `doctor` (`hami.doctor`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from hami import __version__
from hami.errors import HamiError
from hami.plugins import VendorPlugins

__all__ = ["main"]

SERVICES = frozenset({"scheduler", "webhook", "node", "dashboard"})


def vendors_report(plugins: VendorPlugins) -> dict[str, Any]:
    """What `hami vendors --json` prints: loaded, failed and disabled vendors."""
    return {
        "vendors": [
            {
                "name": v.name,
                "display_name": v.info.display_name,
                "distribution": v.distribution,
                "version": v.version,
                "isolation_library": v.info.isolation_library,
                "hooks": list(v.hooks),
                "kinds": [k.model_dump(mode="json") for k in v.info.kinds],
            }
            for v in plugins.vendors
        ],
        "failed": [
            {"name": f.entry_point, "distribution": f.distribution, "version": f.version, "error": f.error}
            for f in plugins.failed
        ],
        "disabled": [{"name": d.entry_point, "distribution": d.distribution} for d in plugins.disabled],
    }


def _print_vendors_table(report: dict[str, Any]) -> None:
    if not report["vendors"]:
        print(
            "no vendor plugins loaded: install one from a checkout of the repository (nothing is on PyPI yet), "
            "e.g. pip install -e ./core -e ./vendors/nvidia, or a wheel built there (docs/plugin-guide.md)"
        )
    for v in report["vendors"]:
        library = v["isolation_library"] or "none"
        print(f"{v['name']:<12} {v['distribution']} {v['version']}  isolation: {library}")
        for k in v["kinds"]:
            res = k["resources"]
            names = [res["count"], res.get("memory"), res.get("memory_percentage"), res.get("cores")]
            print(f"  {k['common_word']:<14} {', '.join(n for n in names if n)}")
    for f in report["failed"]:
        print(f"FAILED {f['name']} ({f['distribution']} {f['version']}): {f['error']}")
    for d in report["disabled"]:
        print(f"disabled {d['name']} ({d['distribution']})")


def _cmd_vendors(args: argparse.Namespace) -> int:
    from hami.config import load_config

    vendors = load_config(args.config).vendors if args.config else None  # each plugin checks its own section
    plugins = VendorPlugins.load(config=vendors)
    report = vendors_report(plugins)
    if args.json:
        print(json.dumps(report, indent=2 if sys.stdout.isatty() else None))
    else:
        _print_vendors_table(report)
    return 1 if report["failed"] else 0


def _cmd_scheduler(args: argparse.Namespace) -> int:
    from hami.companions import run_scheduler_process
    from hami.config import load_config

    config = load_config(
        args.config,
        {
            "kubeconfig": args.kubeconfig,
            "scheduler.listen": args.listen,
            "scheduler.metricsListen": args.metrics_listen,
            "scheduler.nodePolicy": args.node_policy,
            "scheduler.devicePolicy": args.device_policy,
            "scheduler.leaderElection.enabled": True if args.leader_elect else None,
        },
    )
    return run_scheduler_process(config)


class LogfmtFormatter(logging.Formatter):
    """One `key=value` line per record, always one line: easy to read, easy to parse.

    Quoted values are JSON strings (`json.dumps`): quotes, backslashes and newlines escaped, which is the quoting
    logfmt readers (go-logfmt, Loki's `logfmt` stage) decode. Seven lines of the standard library do the job of a
    logfmt dependency here, since the formatter writes only these four keys.
    """

    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"time={self.formatTime(record, '%Y-%m-%dT%H:%M:%S')} level={record.levelname.lower()} "
            f"logger={record.name} msg={json.dumps(record.getMessage(), ensure_ascii=False)}"
        )
        if record.exc_info:
            line += " error=" + json.dumps(self.formatException(record.exc_info), ensure_ascii=False)
        return line


class HamiParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors end, as every other `hami` error does, with the nearest legal
    spelling: a subcommand or choice (`invalid choice: 'statu' … (did you mean 'status'?)`) or an option of the
    subcommand given (`unrecognized arguments: --kep (did you mean '--keep'?)`). Subparsers are of this class too
    (`add_subparsers` makes them of its parser's class)."""

    _argv: Sequence[str] = ()

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        super().error(message + self._hint(message))

    def _hint(self, message: str) -> str:
        from hami.validation import nearest

        choice = re.match(r"argument .*?: invalid choice: '(.*?)' \(choose from (.*)\)$", message)
        if choice:
            near = nearest(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
            return f" (did you mean {near!r}?)" if near else ""
        unknown = re.match(r"unrecognized arguments: (.*)$", message)
        if not unknown:
            return ""
        parser: argparse.ArgumentParser = self
        for word in self._argv:  # down to the subcommand the arguments name
            subcommands = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
            if subcommands is None or word not in subcommands.choices:
                continue
            parser = subcommands.choices[word]
        options = [o for action in parser._actions for o in action.option_strings]
        words = [w.split("=")[0] for w in unknown.group(1).split() if w[:1] == "-"]
        hints = [n for n in (nearest(w, options) for w in words) if n]
        return f" (did you mean {', '.join(map(repr, hints))}?)" if hints else ""


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = HamiParser(
        prog="hami",
        description="Share accelerators between Kubernetes pods, HAMi v2.10-compatible.",
        epilog=(
            "Examples:\n"
            "  hami vendors          list the installed vendor plugins\n"
            "  hami vendors --json   the same, for scripts"
            "\n  hami demo             the whole system on simulated devices, in seconds"
            "\n  hami config check F   validate a configuration file without starting anything"
            "\n  hami status           nodes, devices, who uses them, node locks (of your kubeconfig's cluster)"
            "\n  hami doctor           check this node (or, --container, this container) and say what to fix"
            "\n  source <(hami completion bash)   shell completion"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"hami-core {__version__}")
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity on stderr (default: info for services, warning for tools)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    vendors = sub.add_parser(
        "vendors",
        help="list the installed vendor plugins, their resources and isolation libraries",
        description="List the installed vendor plugins (and those that failed to load, with why). Exits 1 when "
        "any plugin failed. HAMI_DISABLED_VENDORS=a,b switches vendors off.",
        epilog=(
            "Examples:\n"
            "  hami vendors\n"
            "  hami vendors --json | jq '.vendors[].name'\n"
            "  hami vendors --config hami.yaml     the plugins as that file configures them\n"
            "  HAMI_DISABLED_VENDORS=ascend hami vendors"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    vendors.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    vendors.add_argument(
        "--config", metavar="FILE", help="load the plugins with this file's vendors sections (`hami config check`"
        " validates the whole file)",
    )  # fmt: skip
    vendors.set_defaults(func=_cmd_vendors)

    scheduler = sub.add_parser(
        "scheduler",
        help="run the scheduler extender (filter, bind) for kube-scheduler",
        description="Run the scheduler extender that kube-scheduler calls for pods asking for shared devices. "
        "Flags override the configuration file.",
        epilog=(
            "Examples:\n"
            "  hami scheduler --kubeconfig ~/.kube/config --listen 127.0.0.1:8888\n"
            "  hami scheduler --config /etc/hami/hami.yaml --leader-elect"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    scheduler.add_argument("--config", metavar="FILE", help="configuration file (YAML); see hami.config")
    scheduler.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig to use instead of the in-cluster account")
    scheduler.add_argument(
        "--listen", metavar="HOST:PORT", help="extender address (default 127.0.0.1:8888: beside kube-scheduler)"
    )
    scheduler.add_argument("--metrics-listen", metavar="HOST:PORT", help="metrics address (default 0.0.0.0:9395)")
    scheduler.add_argument(
        "--node-policy",
        choices=["binpack", "spread", "best-fit", "fragmentation-aware", "usage"],
        help="default node policy",
    )
    scheduler.add_argument(
        "--device-policy", metavar="CHAIN", help="default device policy, e.g. spread or numa,binpack"
    )
    scheduler.add_argument("--leader-elect", action="store_true", help="elect a leader among replicas through a Lease")
    scheduler.set_defaults(func=_cmd_scheduler)

    from hami.node.cli import add_node_parser
    from hami.simulate.cli import add_simulate_parser
    from hami.webhook.cli import add_webhook_parser

    add_webhook_parser(sub)
    add_node_parser(sub)
    add_simulate_parser(sub)
    from hami.demo.cli import add_demo_parser
    from hami.status import add_status_parser

    add_demo_parser(sub)
    add_status_parser(sub)
    from hami.dashboard.cli import add_dashboard_parser

    add_dashboard_parser(sub)
    from hami.completion import add_completion_parser
    from hami.configcheck import add_config_parser

    add_config_parser(sub)

    add_completion_parser(sub)
    from hami.host.cli import add_host_parsers

    add_host_parsers(sub)
    from hami.doctor.cli import add_doctor_parser

    add_doctor_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    level = args.log_level or ("info" if args.command in SERVICES else "warning")
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler], force=True)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        status: int = args.func(args)
        sys.stdout.flush()
    except HamiError as exc:
        print(f"hami: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `hami vendors | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return status


if __name__ == "__main__":
    sys.exit(main())
