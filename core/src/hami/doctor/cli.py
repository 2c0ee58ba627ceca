"""`hami doctor`: the command's flags, which checks they select, and how the report is printed.

Owns turning the flags into one run of checks (`hami.doctor.node` on a node, `hami.doctor.container` with
``--container``, `hami.doctor.remote` with ``--node``) and printing the findings: a table, or with ``--json`` one
JSON object (``findings``, ``summary``, ``exit``). Exit status: 0 when nothing failed (with ``--strict``: nothing
warned either), 1 otherwise, 2 when the checks could not run at all (a bad configuration, no such node daemon).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hami.findings import Finding, Status, exit_status, render

__all__ = ["DAEMON_CONFIG", "add_doctor_parser", "run_doctor"]

DAEMON_CONFIG = "/etc/hami/hami.yaml"
"""Where the chart mounts the configuration in the node daemon's container: `hami doctor` run there reads it."""


def add_doctor_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register `hami doctor` on the `hami` command's subparsers."""
    parser = subparsers.add_parser(
        "doctor",
        help="check that this node (or container) has what device sharing needs, and say what to fix",
        description="Check, on a node, what the node daemon and each installed vendor need: the kubelet's socket "
        "and the registration, the hook directory and the preload file containers get, the cgroup layout the "
        "backstop reads, the placement key, the clock against the API server, and per vendor its management "
        "library and tool, devices, driver, device nodes, CDI specification and grant directories. --container: "
        "what the isolation library sees in this container. Each check says ok, warning or failed, with what to do.",
        epilog=(
            "Examples:\n"
            "  kubectl -n hami-system exec ds/hami-node -- hami doctor     the node daemon's view, on its node\n"
            "  hami doctor --node gpu-7 --kubeconfig ~/.kube/config          the same, through the cluster\n"
            "  kubectl exec my-pod -- hami doctor --container               in a workload's container\n"
            "  hami doctor --json | jq '.findings[] | select(.status != \"ok\")'\n"
            "Exit status: 0 nothing failed, 1 a check failed (--strict: or warned), 2 the checks could not run."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--container", action="store_true", help="check this container instead of the node")
    where.add_argument(
        "--node",
        metavar="NAME",
        help="run the check in the node daemon's container on node NAME (through the API server, as kubectl exec)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--strict", action="store_true", help="exit 1 on a warning too")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="configuration file (the node and vendors sections; default: "
        f"{DAEMON_CONFIG} where it exists, as in the node daemon's container)",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig (default: $KUBECONFIG, ~/.kube/config, or the pod's service account)",
    )
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context")
    parser.add_argument("--no-cluster", action="store_true", help="do not contact the API server (no clock check)")
    parser.add_argument(
        "--device-plugin-dir",
        metavar="DIR",
        help="the kubelet's device-plugin directory "
        "(default: the node section's, else /var/lib/kubelet/device-plugins)",
    )
    parser.add_argument(
        "--hook-dir",
        metavar="DIR",
        help="where the node daemon installs the isolation libraries "
        "(default: the node section's, else /usr/local/hami)",
    )
    parser.set_defaults(func=run_doctor)
    return parser


def _summary(findings: Sequence[Finding]) -> dict[str, int]:
    return {str(s): sum(1 for f in findings if f.status is s) for s in Status}


def _print(findings: Sequence[Finding], title: str, scope: str, as_json: bool, code: int, node: str) -> None:
    if as_json:
        report = {
            "scope": scope,
            "node": node,
            "findings": [f.as_json() for f in findings],
            "summary": _summary(findings),
            "exit": code,
        }
        print(json.dumps(report, indent=1 if sys.stdout.isatty() else None))
    else:
        sys.stdout.write(render(findings, title))


def run_doctor(args: argparse.Namespace) -> int:
    from hami.config import load_config
    from hami.plugins import VendorPlugins

    path = args.config or (DAEMON_CONFIG if Path(DAEMON_CONFIG).is_file() else None)
    config = load_config(path, {"kubeconfig": args.kubeconfig})
    if args.node:
        return _remote(args, config.kubeconfig)
    plugins = VendorPlugins.load(config=config.vendors)
    node = os.environ.get("NODE_NAME") or socket.gethostname()
    if args.container:
        from hami.doctor.container import container_findings

        findings = container_findings(plugins)
        code = exit_status(findings, strict=args.strict)
        _print(findings, "hami doctor: this container", "container", args.json, code, node)
        return code
    from hami.doctor.node import node_findings
    from hami.node.daemon import NodeSettings

    section: dict[str, Any] = {**config.node, "nodeName": node}
    for key, value in (("devicePluginDir", args.device_plugin_dir), ("hookDir", args.hook_dir)):
        if value:
            section[key] = value
    settings = NodeSettings.model_validate(section)
    date, allocatable, lock_lease = None, None, None
    if not args.no_cluster:
        date, allocatable, lock_lease = _cluster_facts(config.kubeconfig, args.context, node)
    findings = node_findings(
        plugins,
        Path(settings.device_plugin_dir),
        Path(settings.hook_dir),
        date,
        allocatable=allocatable,
        lock_lease=lock_lease,
    )
    findings += [_failed_vendor(f.entry_point, f.error) for f in plugins.failed]
    code = exit_status(findings, strict=args.strict)
    _print(findings, f"hami doctor: node {node}", "node", args.json, code, node)
    return code


def _failed_vendor(name: str, error: str) -> Finding:
    return Finding(
        "plugin",
        Status.FAILED,
        f"did not load: {error}",
        "reinstall the vendor's package (hami vendors shows every plugin)",
        name,
    )


def _cluster_facts(kubeconfig: str | None, context: str | None, node: str) -> tuple[Any, dict[str, str] | None, Any]:
    """The API server's time reader (or one that raises why there is none: the clock check reports it), the
    Node's allocatable (None when it cannot be read), and the reader of its lock offer and Lease."""
    from hami.cluster.kube_tools import api_client, node_allocatable, node_lock_lease, server_date

    try:
        api = api_client(kubeconfig, context)
    except Exception as exc:  # no kubeconfig, a broken one: the clock check says so
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__

        def unavailable() -> Any:
            raise RuntimeError(reason)

        return unavailable, None, unavailable
    return server_date(api), node_allocatable(api, node), node_lock_lease(api, node)


def _remote(args: argparse.Namespace, kubeconfig: str | None) -> int:
    from hami.cluster.kube_tools import api_client
    from hami.cluster.port import ClusterError
    from hami.doctor.remote import RemoteError, parse_report, run_on_node

    argv = ["--json"] + (["--strict"] if args.strict else [])
    try:
        status, out, err = run_on_node(api_client(kubeconfig, args.context), args.node, argv)
        report = parse_report(out, f"node {args.node}")
    except (RemoteError, ClusterError) as exc:
        print(f"hami doctor: {exc}", file=sys.stderr)
        return 2
    findings = [
        Finding(
            str(f.get("check", "")),
            Status(f.get("status", "failed")),
            str(f.get("detail", "")),
            str(f.get("fix", "")),
            str(f.get("vendor", "")),
        )
        for f in report["findings"]
        if isinstance(f, dict)
    ]
    if err.strip():
        print(err.strip(), file=sys.stderr)
    _print(findings, f"hami doctor: node {args.node} (the node daemon's view)", "node", args.json, status, args.node)
    return status
