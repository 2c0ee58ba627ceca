"""`hami webhook` (serve the admission webhook) and `hami webhook certs` (make its certificates).

Owns the two subcommands' arguments and turning them into calls of `hami.webhook.run` and `hami.webhook.certs`;
`hami.cli` registers them through `add_webhook_parser`. Flags override the configuration file's `webhook`
section (when the configuration model has one), which overrides the defaults.
"""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import BaseModel, ValidationError

from hami.errors import ConfigError
from hami.validation import describe

__all__ = ["add_webhook_parser"]


def add_webhook_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register `hami webhook` and `hami webhook certs` on the top-level subparsers; returns the `webhook` parser."""
    webhook = subparsers.add_parser(
        "webhook",
        help="run the mutating admission webhook (HTTPS) that sends device pods to the scheduler",
        description="Run the admission webhook: pods asking for shared devices get the scheduler's name and their "
        "vendors' defaults; privileged device containers, preset nodeName and quota overruns are refused. "
        "Flags override the configuration file. The certificate and key are re-read when they change.",
        epilog=(
            "Examples:\n"
            "  hami webhook certs --service hami-webhook --namespace kube-system --out /tmp/hami-tls\n"
            "  hami webhook --kubeconfig ~/.kube/config --tls-cert /tmp/hami-tls/tls.crt "
            "--tls-key /tmp/hami-tls/tls.key"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    webhook.add_argument("--config", metavar="FILE", help="configuration file (YAML); see hami.config")
    webhook.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig to use instead of the in-cluster account")
    webhook.add_argument("--listen", metavar="HOST:PORT", help="HTTPS address (default 0.0.0.0:9443)")
    webhook.add_argument("--tls-cert", metavar="FILE", help="serving certificate (PEM), reloaded when it changes")
    webhook.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    webhook.add_argument(
        "--scheduler-name", metavar="NAME", help="scheduler that device pods are sent to (default hami-scheduler)"
    )
    webhook.set_defaults(func=_cmd_webhook)

    sub = webhook.add_subparsers(dest="webhook_command", metavar="COMMAND")
    certs = sub.add_parser(
        "certs",
        help="write a self-signed CA and a serving certificate for the webhook's Service",
        description="Write tls.crt, tls.key, ca.crt and ca.key into a folder, for clusters without cert-manager. "
        "The certificate is valid for <service>, <service>.<namespace>, <service>.<namespace>.svc and "
        "<service>.<namespace>.svc.cluster.local. A CA already in the folder is reused (so the caBundle of the "
        "MutatingWebhookConfiguration stays valid) unless --new-ca is given. Prints the caBundle.",
        epilog=(
            "Example:\n"
            "  hami webhook certs --service hami-webhook --namespace kube-system --out ./tls\n"
            "  kubectl -n kube-system create secret tls hami-webhook-tls --cert ./tls/tls.crt --key ./tls/tls.key"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    certs.add_argument("--service", required=True, metavar="NAME", help="the webhook's Service name")
    certs.add_argument("--namespace", required=True, metavar="NS", help="the Service's namespace")
    certs.add_argument("--out", required=True, metavar="DIR", help="folder to write the files into")
    certs.add_argument("--days", type=int, default=365, help="validity of the serving certificate (default 365)")
    certs.add_argument(
        "--extra-san",
        action="append",
        default=[],
        metavar="NAME",
        help="a further DNS name or IP address for the certificate (repeatable), e.g. 127.0.0.1",
    )
    certs.add_argument("--new-ca", action="store_true", help="make a new CA even when the folder has one")
    certs.add_argument(
        "--ca-dir",
        metavar="DIR",
        help="keep the CA (ca.crt, ca.key) in this folder instead of --out, which then holds no CA key: make the "
        "webhook's serving Secret from --out and keep this folder private",
    )
    certs.set_defaults(func=_cmd_certs)
    return webhook


def _cmd_webhook(args: argparse.Namespace) -> int:
    from hami.config import load_config
    from hami.webhook.run import run_webhook

    config = load_config(args.config, {"kubeconfig": args.kubeconfig})
    settings = webhook_settings(getattr(config, "webhook", None), args)
    return run_webhook(config, settings)


def webhook_settings(section: Any, args: argparse.Namespace) -> Any:
    """The configuration's `webhook` section (a model, a mapping or None) with the flags applied over it."""
    from hami.webhook.settings import WebhookConfig

    if isinstance(section, BaseModel):
        raw: dict[str, Any] = section.model_dump(by_alias=True, exclude_none=True)
    else:
        raw = dict(section or {})
    if args.listen:
        raw["listen"] = args.listen
    if args.scheduler_name:
        raw["schedulerName"] = args.scheduler_name
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise ConfigError("give both --tls-cert and --tls-key")
        raw["tls"] = {"certFile": args.tls_cert, "keyFile": args.tls_key}
    try:
        return WebhookConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe(exc, WebhookConfig, "configuration", prefix=("webhook",))) from None


def validate_webhook_section(section: Any) -> Any:
    """The configuration's `webhook` section as a `WebhookConfig` (no flags over it)."""
    return webhook_settings(section, argparse.Namespace(listen=None, scheduler_name=None, tls_cert=None, tls_key=None))


def _cmd_certs(args: argparse.Namespace) -> int:
    from hami.webhook.certs import generate, load_ca, write_bundle

    ca = None if args.new_ca else load_ca(args.ca_dir or args.out)
    bundle = generate(args.service, args.namespace, extra_names=args.extra_san, days=args.days, ca=ca)
    paths = write_bundle(bundle, args.out, ca_directory=args.ca_dir)
    print(f"serving certificate for {', '.join(bundle.dns_names + list(_ips(args.extra_san)))}, {args.days} days:")
    print(f"  {paths['tls.crt']}\n  {paths['tls.key']}")
    print(f"CA ({'reused' if ca else 'new'}):\n  {paths['ca.crt']}\n  {paths['ca.key']} (keep it private)")
    print("caBundle for the MutatingWebhookConfiguration:")
    print(bundle.ca_bundle)
    return 0


def _ips(names: list[str]) -> list[str]:
    import ipaddress

    out = []
    for name in names:
        try:
            out.append(str(ipaddress.ip_address(name)))
        except ValueError:
            continue
    return out
