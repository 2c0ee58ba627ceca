"""`python -m hami.node [flags]`: the node daemon without the `hami` command (tests start it this way).

Takes exactly the flags of `hami node` (`hami.node.cli`), plus `--log-level`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from hami.errors import HamiError
from hami.node.cli import add_node_parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hami.node", add_help=False)
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    subparsers = parser.add_subparsers(dest="command")
    add_node_parser(subparsers)
    args = parser.parse_args(["node", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="time=%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)r",
        stream=sys.stderr,
    )
    try:
        status: int = args.func(args)
    except HamiError as exc:
        print(f"hami: {exc}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
