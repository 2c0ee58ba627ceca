"""`hami node`: the node daemon's command line (`add_node_parser`), and `python -m hami.node` for the same.

Owns the flags and their translation into `hami.node.daemon.NodeSettings`; the configuration file gives the
kubeconfig and the vendors' sections. Flags left out keep the settings' defaults.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from hami.errors import ConfigError
from hami.validation import describe

if TYPE_CHECKING:  # the daemon's imports (gRPC, the cluster client) load only when the command runs
    from hami.node.daemon import NodeSettings

__all__ = ["add_node_parser", "node_settings", "run_node_command"]


def add_node_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register `hami node` on the `hami` command's subparsers; returns the new parser."""
    parser = subparsers.add_parser(
        "node",
        help="run the node daemon: device plugins for the kubelet, node registration, Allocate, metrics",
        description="Run the node daemon on one node (a DaemonSet): serve every installed vendor's devices to the "
        "kubelet through the device-plugin API, publish them on the Node for the scheduler, answer Allocate with "
        "each container's devices and isolation library, and export node metrics. Stops cleanly on SIGTERM.",
        epilog=(
            "Examples:\n"
            "  hami node --node-name $(hostname)\n"
            "  hami node --config /etc/hami/hami.yaml --metrics-listen 0.0.0.0:9394\n"
            "  hami node --node-name gpu-node --simulated-inventory examples/demo-inventory.yaml --kubeconfig K"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", metavar="FILE", help="configuration file (YAML); vendors' sections, kubeconfig")
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig to use instead of the in-cluster account")
    parser.add_argument(
        "--node-name",
        metavar="NAME",
        default=os.environ.get("NODE_NAME"),
        help="this node's name (default: $NODE_NAME, set from the downward API's spec.nodeName)",
    )
    parser.add_argument(
        "--device-plugin-dir",
        metavar="DIR",
        help="the kubelet's device-plugin directory holding kubelet.sock (default /var/lib/kubelet/device-plugins)",
    )
    parser.add_argument(
        "--hook-dir", metavar="DIR", help="host directory for isolation libraries and containers' accounting files "
        "(default /usr/local/hami)"
    )  # fmt: skip
    parser.add_argument("--metrics-listen", metavar="HOST:PORT", help="metrics address (default 0.0.0.0:9394)")
    parser.add_argument(
        "--discovery-interval", metavar="SECONDS", type=float, help="seconds between device discoveries (default 10)"
    )
    parser.add_argument(
        "--register-interval",
        metavar="SECONDS",
        type=float,
        help="seconds between checks of the node's annotations and handshake (default 30)",
    )
    parser.add_argument(
        "--simulated-inventory",
        metavar="FILE",
        help="read this node's devices from an inventory file instead of the vendors' drivers (simulated "
        "devices, as `hami demo` runs them; format: hami.node.simulated, e.g. examples/demo-inventory.yaml)",
    )
    parser.set_defaults(func=run_node_command)
    return parser


def node_settings(args: argparse.Namespace, section: dict[str, Any] | None = None) -> NodeSettings:
    """`NodeSettings` from the configuration's `node` section with the flags over it.

    :raises ConfigError: a missing node name or a bad value."""
    from hami.node.daemon import NodeSettings

    if not args.node_name:
        raise ConfigError(
            "hami node needs this node's name: pass --node-name or set NODE_NAME (in a DaemonSet, from the downward "
            "API: valueFrom.fieldRef.fieldPath spec.nodeName)"
        )
    given = {
        "nodeName": args.node_name,
        "devicePluginDir": args.device_plugin_dir,
        "hookDir": args.hook_dir,
        "metricsListen": args.metrics_listen,
        "discoveryIntervalSeconds": args.discovery_interval,
        "registerIntervalSeconds": args.register_interval,
        "simulatedInventory": getattr(args, "simulated_inventory", None),
    }
    try:
        return NodeSettings.model_validate({**(section or {}), **{k: v for k, v in given.items() if v is not None}})
    except ValidationError as exc:
        raise ConfigError(describe(exc, NodeSettings, "hami node", prefix=("node",))) from None


def run_node_command(args: argparse.Namespace) -> int:
    """What `hami node` runs: load the configuration, then serve until SIGTERM."""
    from hami.config import load_config
    from hami.node.daemon import run_node

    config = load_config(args.config, {"kubeconfig": args.kubeconfig})
    settings = node_settings(args, config.node)
    return run_node(config, settings)
