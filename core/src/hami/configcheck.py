"""`hami config check FILE`: validate a whole configuration file without starting anything.

Owns the check, section by section, in the same words each service would use when it starts: the top level and
`scheduler` (`hami.config`), `webhook` (`hami.webhook.settings`), `node` (`hami.node.daemon.NodeSettings`; the
node name comes from the downward API at run time, so a placeholder stands in when the file has none), and each
`vendors.<name>` section through that vendor's own `hami_vendor_settings` hook. A section for a vendor that is not
installed is reported with the nearest installed name, since a typo there would otherwise be silently ignored.
Every problem is listed, not only the first; the exit status is 2 when any was found.
"""

from __future__ import annotations

import argparse
import logging

from hami.errors import ConfigError, HamiError

__all__ = ["add_config_parser", "check_config"]

_NODE_PLACEHOLDER = "node-name-from-the-downward-api"


def check_config(path: str) -> list[str]:
    """Every problem of the configuration file at `path`, in the one error format; empty when it is valid."""
    from hami.config import HamiConfig, load_config, read_config_file
    from hami.plugins import VendorPlugins, installed_sources
    from hami.validation import nearest

    problems: list[str] = []
    try:
        config = load_config(path)
    except ConfigError as exc:
        problems = str(exc).splitlines()  # unreadable, or the top level's or the scheduler section's problems
        try:  # the other sections are still checked, each by its own model, when they are sections at all
            raw = read_config_file(path)
            config = HamiConfig.model_validate({k: raw[k] for k in ("webhook", "node", "vendors") if k in raw})
        except (ConfigError, ValueError):
            return problems
    try:
        from hami.webhook.cli import validate_webhook_section

        validate_webhook_section(config.webhook)
    except ConfigError as exc:
        problems.extend(f"{path}: {line.split(': ', 1)[1]}" for line in str(exc).splitlines())
    try:
        from hami.node.cli import node_settings

        node = dict(config.node)
        flags = argparse.Namespace(
            node_name=node.pop("nodeName", None) or _NODE_PLACEHOLDER,
            device_plugin_dir=None, hook_dir=None, metrics_listen=None, discovery_interval=None,
            register_interval=None, simulated_inventory=None,
        )  # fmt: skip
        node_settings(flags, node)
    except ConfigError as exc:
        problems.extend(f"{path}: {line.split(': ', 1)[1]}" for line in str(exc).splitlines())
    installed = [source.name for source in installed_sources()]
    for name in config.vendors:
        if name not in installed:
            near = nearest(name, installed)
            hint = f" (did you mean {near!r}?)" if near else ""
            problems.append(
                f"{path}: vendors.{name}: no installed vendor is called {name!r}; installed: "
                f"{', '.join(installed) or 'none'}{hint}"
            )
    logging.getLogger("hami.plugins").setLevel(logging.CRITICAL)  # broken plugins are `hami vendors`' report
    for name, section in config.vendors.items():
        if name in installed:  # one vendor at a time, so that every vendor's problems are listed
            try:
                VendorPlugins.load(config={name: section}, disabled=[n for n in installed if n != name])
            except ConfigError as exc:
                problems.extend(f"{path}: {line.split(': ', 1)[1]}" for line in str(exc).splitlines())
    return problems


def _cmd_check(args: argparse.Namespace) -> int:
    problems = check_config(args.file)
    if problems:
        for line in problems:
            print(line)
        return 2
    print(f"{args.file}: valid")
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    raise HamiError("hami config: give a subcommand: check FILE")


def add_config_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "config",
        help="check a configuration file without starting a service",
        description="Tools for the configuration file every `hami` command reads with --config.",
    )
    parser.set_defaults(func=_cmd_config)
    sub = parser.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    check = sub.add_parser(
        "check",
        help="validate every section (scheduler, webhook, node, vendors.<name>); exit 2 listing each problem",
        description="Validate FILE as the services would when they start, every section, every problem listed.",
        epilog="Example:\n  hami config check /etc/hami/hami.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("file", metavar="FILE", help="the configuration file (YAML or JSON)")
    check.set_defaults(func=_cmd_check)
    return parser
