"""The one configuration model every `hami` command reads: a YAML (or JSON) file, then command-line overrides.

Owns the file's shape and its validation. A wrong key or value is reported with the file, the dotted path of
the key, what is legal and the nearest legal spelling (`hami.yaml: scheduler.nodePolicy: 'binpak' is not legal;
legal: binpack, spread, best-fit, fragmentation-aware, usage (did you mean 'binpack'?)`; `hami.validation`), never as a
traceback. `hami config check FILE` validates every section without starting a service. Vendor sections
(`vendors.<name>`) are passed through untouched and validated by each
vendor's `hami_vendor_settings` hook when the plugins load.

    kubeconfig: ~/.kube/config        # absent: in-cluster configuration
    scheduler:
      listen: 127.0.0.1:8888          # the extender's HTTP(S) address (default: loopback, beside kube-scheduler)
      metricsListen: 0.0.0.0:9395
      dashboardListen: 0.0.0.0:8090   # the web dashboard (hami.dashboard); absent: not served
      dashboardNodeMetrics: http://{address}:9394/metrics   # real usage on its device pages; absent: not read
      dashboardPrometheus: http://prometheus:9090           # its history from Prometheus; absent: in-process
      tls: {certFile: /tls/tls.crt, keyFile: /tls/tls.key, clientCAFile: /tls/client-ca.crt}  # HTTPS; client certs
      nodePolicy: binpack             # spread | best-fit | fragmentation-aware | usage
      devicePolicy: [spread]          # binpack | spread | topology-aware | numa | mutex; default per node policy
      leaderElection: {enabled: true, namespace: kube-system, name: hami-scheduler}
    webhook:                          # `hami webhook`, or served by `hami scheduler` when enabled
      enabled: false
      listen: 0.0.0.0:9443
      tls: {certFile: /tls/tls.crt, keyFile: /tls/tls.key, clientCAFile: /tls/client-ca.crt}  # HTTPS; client certs
    node:                             # `hami node`
      devicePluginDir: /var/lib/kubelet/device-plugins
      hookDir: /usr/local/hami
      metricsListen: 0.0.0.0:9394
    vendors:
      nvidia: {deviceSplitCount: 10, defaultMemory: 0}

The `webhook` and `node` sections are validated by their services' own models (`hami.webhook.settings`,
`hami.node.daemon.NodeSettings`) when those services start, with the same kind of message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hami.errors import ConfigError
from hami.validation import describe

__all__ = [
    "HamiConfig",
    "LeaderElectionConfig",
    "SchedulerConfig",
    "TLSConfig",
    "load_config",
    "parse_address",
    "read_config_file",
]


def parse_address(value: str) -> tuple[str, int]:
    """`host:port` (or `:port`, meaning all interfaces) → (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not <host>:<port>, e.g. 0.0.0.0:8888 or 127.0.0.1:0")
    return host.strip("[]") or "0.0.0.0", int(port)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class TLSConfig(_Section):
    cert_file: str = Field(alias="certFile")
    key_file: str = Field(alias="keyFile")
    client_ca_file: str | None = Field(
        default=None,
        alias="clientCAFile",
        description="clients must present a certificate this CA signed (kube-scheduler's, for the extender)",
    )


class LeaderElectionConfig(_Section):
    enabled: bool = False
    namespace: str = "kube-system"
    name: str = "hami-scheduler"
    lease_duration_seconds: float = Field(default=15, gt=0, alias="leaseDurationSeconds")


class PreemptionConfig(_Section):
    """Preemption by device share (docs/preemption.md)."""

    enabled: bool = False
    dry_run: bool = Field(default=False, alias="dryRun")
    """Only record what would be evicted (an Event on the preemptor, a log line, the metric's `dry_run`)."""
    hold_seconds: float = Field(default=120, gt=0, alias="holdSeconds")
    """How long the room freed is held for the preemptor."""


class SchedulerConfig(_Section):
    listen: str = "127.0.0.1:8888"
    """The extender answers kube-scheduler beside it; elsewhere, with `tls` (and its `clientCAFile`)."""
    metrics_listen: str = Field(default="0.0.0.0:9395", alias="metricsListen")
    dashboard_listen: str | None = Field(default=None, alias="dashboardListen")
    dashboard_node_metrics: str | None = Field(default=None, alias="dashboardNodeMetrics")
    dashboard_prometheus: str | None = Field(default=None, alias="dashboardPrometheus")
    url_prefix: str = Field(default="", alias="urlPrefix")
    tls: TLSConfig | None = None
    node_policy: str = Field(
        default="binpack", alias="nodePolicy", pattern="^(binpack|spread|best-fit|fragmentation-aware|usage)$"
    )
    device_policy: tuple[str, ...] | None = Field(default=None, alias="devicePolicy")
    batch_size: int = Field(default=16, ge=1, alias="batchSize")
    lock_expiry_seconds: float = Field(default=300, gt=0, alias="lockExpirySeconds")
    bind_lock_wait_seconds: float = Field(default=5, ge=0, alias="bindLockWaitSeconds")
    pass_over_nodes_in_flight: bool = Field(default=True, alias="passOverNodesInFlight")
    """A node whose earlier decision still awaits its Allocate is read after every other candidate: a bind there
    would wait for that pod's node lock. False: the node policy's order alone (HAMi's)."""
    handshake_interval_seconds: float = Field(default=30, ge=0, alias="handshakeIntervalSeconds")
    dra_driver: str | None = Field(
        default=None,
        alias="draDriver",
        description="count the devices kube-scheduler allocated to ResourceClaims of this DRA driver (hami.dra)",
    )
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig, alias="leaderElection")
    preemption: PreemptionConfig = Field(default_factory=PreemptionConfig)

    @field_validator("listen", "metrics_listen", "dashboard_listen")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None:
            parse_address(value)
        return value

    @field_validator("device_policy", mode="before")
    @classmethod
    def _chain(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [p.strip() for p in value.split(",") if p.strip()]
        legal = ("binpack", "spread", "topology-aware", "numa", "mutex", "best-fit", "fragmentation-aware", "usage")
        for policy in value or ():
            if policy not in legal:
                raise ValueError(f"{policy!r} is not one of {', '.join(legal)}")
        return value


class HamiConfig(_Section):
    log_level: str = Field(default="info", alias="logLevel", pattern="^(debug|info|warning|error)$")
    kubeconfig: str | None = None
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    webhook: dict[str, Any] = Field(default_factory=dict)
    node: dict[str, Any] = Field(default_factory=dict)
    vendors: dict[str, dict[str, Any]] = Field(default_factory=dict)


def load_config(path: str | Path | None, overrides: Mapping[str, Any] | None = None) -> HamiConfig:
    """Read and validate the configuration file (None: defaults), then apply dotted-key `overrides`."""
    raw = read_config_file(path) if path else {}
    source = str(path) if path else "defaults"
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        target = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            target = target.setdefault(key, {})
        target[leaf] = value
    try:
        return HamiConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe(exc, HamiConfig, source)) from None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The file's sections as written, not yet validated. :raises ConfigError: it cannot be read or parsed."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc.strerror}") from None
    return _parse(text, str(path))


def _parse(text: str, source: str) -> dict[str, Any]:
    try:
        import yaml

        data = yaml.safe_load(text)
    except ImportError:  # pragma: no cover - PyYAML comes with the kubernetes client
        data = json.loads(text)
    except Exception as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections (scheduler, vendors, ...)")
    return data
