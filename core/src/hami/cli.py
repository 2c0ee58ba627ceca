"""The `hami` command: one entry point for every service and tool of the project.

Owns argument parsing, logging set-up and turning deliberate errors (`hami.errors.HamiError`) into a
one-line message and exit status 2. Each subcommand's work lives in its own module; this file only wires
them. Subcommands so far: `vendors`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from hami import __version__
from hami.errors import HamiError
from hami.plugins import VendorHost

__all__ = ["main"]


def vendors_report(host: VendorHost) -> dict[str, Any]:
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
            for v in host.vendors
        ],
        "failed": [
            {"name": f.entry_point, "distribution": f.distribution, "version": f.version, "error": f.error}
            for f in host.failed
        ],
        "disabled": [{"name": d.entry_point, "distribution": d.distribution} for d in host.disabled],
    }


def _print_vendors_table(report: dict[str, Any]) -> None:
    if not report["vendors"]:
        print("no vendor plugins loaded: pip install hami-vendor-<name> (nvidia, ascend, cambricon, hygon, ...)")
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
    host = VendorHost.load()
    report = vendors_report(host)
    if args.json:
        print(json.dumps(report, indent=2 if sys.stdout.isatty() else None))
    else:
        _print_vendors_table(report)
    return 1 if report["failed"] else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hami",
        description="Share accelerators between Kubernetes pods, HAMi v2.10-compatible.",
        epilog=(
            "Examples:\n"
            "  hami vendors          list the installed vendor plugins\n"
            "  hami vendors --json   the same, for scripts"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"hami-core {__version__}")
    parser.add_argument(
        "--log-level", default="warning", choices=["debug", "info", "warning", "error"], help="log verbosity (stderr)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    vendors = sub.add_parser(
        "vendors",
        help="list the installed vendor plugins, their resources and isolation libraries",
        description="List the installed vendor plugins (and those that failed to load, with why). Exits 1 when "
        "any plugin failed. HAMI_DISABLED_VENDORS=a,b switches vendors off.",
    )
    vendors.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    vendors.set_defaults(func=_cmd_vendors)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
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
