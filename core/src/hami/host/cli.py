"""The parsers of ``hami run`` and ``hami host``: flags to `hami.host.run` and `hami.host.install`, nothing more."""

from __future__ import annotations

import argparse
import json
import os
import pwd
from pathlib import Path
from typing import Any

from hami.errors import HamiError

__all__ = ["add_host_parsers"]

_RAW = argparse.RawDescriptionHelpFormatter


def _vendor_plugins(config: str | None, vendor: str) -> Any:
    """A host over the one vendor asked for (discovery asks no other driver), or over all to say which exist."""
    from hami.config import load_config
    from hami.plugins import VendorPlugins, installed_sources

    sources = [source for source in installed_sources() if source.name == vendor]
    return VendorPlugins.load(config=load_config(config).vendors, sources=sources or None)


def _request(args: argparse.Namespace, **extra: Any) -> Any:
    """The request the flags common to ``hami run`` and ``hami host grant`` make (`hami.host.run.RunRequest`)."""
    from hami.host import run

    values = {
        "--vendor": args.vendor,
        "--device": args.device,
        "--memory": args.memory,
        "--cores": args.cores,
        "--share": args.share,
        **extra,
    }
    return run.parse_request({k: v for k, v in values.items() if v is not None})


def _user(name: str | None, command: str) -> pwd.struct_passwd | None:
    if name is None:
        return None
    try:
        return pwd.getpwnam(name) if not name.isdigit() else pwd.getpwuid(int(name))
    except KeyError:
        raise HamiError(f"{command}: --user: no user {name!r} on this host") from None


def _add_request_flags(parser: argparse.ArgumentParser, share_help: str, share_required: bool) -> None:
    parser.add_argument("--vendor", required=True, help="the vendor plugin (see hami vendors)")
    parser.add_argument("--device", required=True, metavar="N[,M...]", help="device index(es), as discovered")
    parser.add_argument("--memory", required=True, metavar="MiB", help="memory per device: MiB, or 8Gi; 0 = the whole")
    parser.add_argument("--cores", metavar="PCT", help="percent of device time per device (0 or 100: no limit)")
    parser.add_argument("--share", required=share_required, metavar="NAME", help=share_help)
    parser.add_argument("--config", metavar="FILE", help="configuration file (YAML; its vendors section is used)")


def _cmd_run(args: argparse.Namespace) -> int:
    import sys

    try:
        return _run(args)
    except HamiError as exc:
        print(exc, file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    import logging

    from hami.host import run

    command = list(args.argv)
    if command[:1] == ["--"]:
        command = command[1:]
    request = _request(args, COMMAND=command)
    root = os.geteuid() == 0
    confined = root and not args.no_namespace
    if args.user is not None and not confined:
        raise HamiError("hami run: --user: only root can run a command as another user (without --no-namespace)")
    user = _user(args.user, "hami run")
    plugins = _vendor_plugins(args.config, request.vendor)
    state = Path(args.state_dir) if args.state_dir else run.default_state_dir()
    launch = run.plan(request, plugins, state, confined=confined, user=user)
    if not confined or user is None:
        logging.getLogger("hami.host").warning(
            "hami run: the command runs as %s, who %s: this limits the command, it confines no one (hami run as "
            "root with --user keeps the grant out of the user's reach)",
            "root" if root and user is None else "the invoking user",
            "can do anything" if root else "can rewrite the grant and drop LD_PRELOAD",
        )
    run.prepare(launch, plugins)
    return run.run(launch)


def _cmd_grant(args: argparse.Namespace) -> int:
    import sys

    from hami.host import run

    try:
        request = _request(args)
        user = _user(args.user, "hami host grant")
        plugins = _vendor_plugins(args.config, request.vendor)
        state = Path(args.state_dir) if args.state_dir else run.default_state_dir()
        launch = run.plan(request, plugins, state, confined=True, user=user)
        run.prepare(launch, plugins)
    except HamiError as exc:
        print(exc, file=sys.stderr)
        return 2
    flags = run.container_flags(launch)
    if args.json:
        print(
            json.dumps(
                {
                    "name": launch.name,
                    "grant_dir": str(launch.grant_dir),
                    "accounting_file": str(launch.accounting_file),
                    "flags": flags,
                    "edits": launch.edits.model_dump(mode="json"),
                },
                indent=1,
            )
        )
    else:
        print(" \\\n".join(flags))
    return 0


def _cmd_install(args: argparse.Namespace) -> int:
    import sys

    from hami.host import install

    try:
        from hami.config import load_config
        from hami.plugins import VendorPlugins

        plugins = VendorPlugins.load(config=load_config(args.config).vendors)
        prefix = Path(args.prefix or "/")
        libraries = install.install(plugins, prefix, args.vendor or (), args.libdir or install.LIBRARY_ROOT)
        written = install.write_cdi(libraries, prefix) if args.write else []
    except HamiError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.json:
        report = {
            "libraries": [vars(lib) for lib in libraries],
            "cdi": [install.cdi_spec(lib) for lib in libraries],
            "written": [str(p) for p in written],
        }
        print(json.dumps(report, indent=1))
    else:
        sys.stdout.write(install.render_install(libraries, written))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    import sys

    from hami.host import install, run

    runs = install.status(Path(args.state_dir) if args.state_dir else run.default_state_dir())
    if args.json:
        print(json.dumps({"runs": runs}, indent=1))
    else:
        sys.stdout.write(install.render_status(runs))
    return 0


def add_host_parsers(sub: Any) -> None:
    """Add ``run`` and ``host`` to the ``hami`` command's subparsers."""
    parser = sub.add_parser(
        "run",
        help="run a command and its children under a vendor's isolation library with a memory and compute grant",
        description="Run COMMAND, and every process it starts, under the vendor's isolation library with the grant "
        "a container would get: memory per device, percent of device time. --share NAME makes commands with the "
        "same name share one limit. As root, the command gets a private mount namespace with /etc/ld.so.preload "
        "and /etc/hami/grant read-only (as in a container); --user runs it as that user, who cannot lift the limit. "
        "Otherwise LD_PRELOAD carries the library (a limit the command keeps, not a confinement). See docs/host.md.",
        epilog=(
            "Examples:\n"
            "  hami run --vendor nvidia --device 0 --memory 3000 --cores 30 -- python train.py\n"
            "  sudo hami run --vendor nvidia --device 0 --memory 8Gi --user alice --share alice-nb -- jupyter lab\n"
            "  hami run --vendor ascend --device 1 --memory 16384 -- ./infer"
        ),
        formatter_class=_RAW,
    )
    _add_request_flags(parser, "share one limit with the other commands run with NAME", share_required=False)
    parser.add_argument("--user", metavar="USER", help="run the command as USER (root only)")
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="grants, accounting files, libraries (default /run/hami as root, $XDG_RUNTIME_DIR/hami otherwise)",
    )
    parser.add_argument(
        "--no-namespace",
        action="store_true",
        help="as root too, carry the library in LD_PRELOAD instead of a private mount namespace",
    )
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND...", help="the command to run")
    parser.set_defaults(func=_cmd_run)

    host = sub.add_parser(
        "host",
        help="isolation libraries on a host without Kubernetes: install them, show each grant's usage",
        description="The isolation libraries outside Kubernetes (docs/host.md).",
        formatter_class=_RAW,
    )
    verbs = host.add_subparsers(dest="verb", metavar="VERB", required=True)
    installer = verbs.add_parser(
        "install",
        help="install the vendors' libraries under versioned paths; print (--write: write) the runtime configuration",
        description="Install each loaded vendor's isolation library under PREFIX/usr/local/lib/hami/<vendor>/ "
        "(a versioned file, a stable symlink, an ld.so.preload naming it), and print the configuration a "
        "container engine or VM agent needs; --write also writes the CDI specifications (PREFIX/etc/cdi/). "
        "PREFIX is a staging root: the files name the final paths.",
        epilog="Examples:\n  sudo hami host install --write\n"
        "  hami host install --prefix pkgroot --libdir /usr/lib/hami --write --vendor nvidia",
        formatter_class=_RAW,
    )
    installer.add_argument("--prefix", metavar="DIR", help="staging root (default /)")
    installer.add_argument("--libdir", metavar="DIR", help="where the libraries go (default /usr/local/lib/hami)")
    installer.add_argument("--write", action="store_true", help="also write the CDI specifications")
    installer.add_argument("--vendor", action="append", metavar="NAME", help="only this vendor (repeatable)")
    installer.add_argument("--config", metavar="FILE", help="configuration file (YAML; its vendors section is used)")
    installer.add_argument("--json", action="store_true", help="print one JSON object")
    installer.set_defaults(func=_cmd_install)
    grant = verbs.add_parser(
        "grant",
        help="write a named grant (a --share) for containers and print the docker/podman flags that use it",
        description="Write the grant, accounting directory and library of share NAME exactly as hami run --share "
        "NAME does, without running anything, and print the vendor's container edits as docker/podman run flags "
        "(the grant directory mounted read-only at /etc/hami/grant): every container started with them, and every "
        "hami run --share NAME, shares one limit. --user: the user the containers' processes run as (the "
        "accounting directory is theirs).",
        epilog="Example:\n  sudo hami host grant --vendor nvidia --device 0 --memory 8000 --share team-a",
        formatter_class=_RAW,
    )
    _add_request_flags(grant, "the grant's name (hami run --share NAME joins it)", share_required=True)
    grant.add_argument("--user", metavar="USER", help="owner of the accounting directory")
    grant.add_argument("--state-dir", metavar="DIR", help="as for hami run (default /run/hami as root)")
    grant.add_argument("--json", action="store_true", help="print one JSON object (the flags and the edits)")
    grant.set_defaults(func=_cmd_grant)
    state = verbs.add_parser(
        "status",
        help="each grant hami run recorded, with its usage from its accounting file",
        description="Every run hami run recorded in the state directory: per device the memory used, its limit "
        "and peak, the compute limit, and the live processes, from the run's accounting file.",
        formatter_class=_RAW,
    )
    state.add_argument("--state-dir", metavar="DIR", help="as given to hami run (default /run/hami as root)")
    state.add_argument("--json", action="store_true", help="print one JSON object")
    state.set_defaults(func=_cmd_status)
