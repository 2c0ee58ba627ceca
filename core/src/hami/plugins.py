"""The vendor plugins: loads them and is the only place that calls into their hooks.

Loading (`VendorPlugins.load`) reads every entry point of the group ``hami.vendors``. A plugin whose import
fails, whose hooks do not match the contract (a misspelled hook name, an argument the specification does not
have), or whose metadata clashes with an already loaded vendor is logged with its distribution name and
skipped; the others keep working. ``HAMI_DISABLED_VENDORS`` (comma list of vendor names) switches vendors
off. With ``strict=True`` the first such problem raises `PluginError` instead, which is what the conformance
kit uses so that a plugin author's test fails loudly.

Calling: `VendorPlugins` has one typed method per hook. Routed hooks go only to the vendor that owns the
device kind (a cached pluggy subset caller per vendor), so a hot path such as filtering pays one Python
call per vendor involved. Nothing outside this module touches ``pm.hook``.
"""

from __future__ import annotations

import difflib
import logging
import os
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy
from pydantic import BaseModel, ValidationError

from hami import hookspecs
from hami.errors import ConfigError, PluginError
from hami.findings import Finding, Status
from hami.islands import asks_island, fit_within_islands
from hami.model import (
    AdmissionEdit,
    Allocation,
    Container,
    ContainerEdits,
    ContainerPlacement,
    ContainerRequest,
    Device,
    DeviceKind,
    DeviceProcess,
    DeviceReading,
    DraDevice,
    DrmUsageSource,
    IsolationLibrary,
    NodeFit,
    NodeInventory,
    NodeView,
    Pod,
    SchedulingPolicy,
    VendorInfo,
)
from hami.validation import describe

__all__ = ["DisabledVendor", "ENTRY_POINT_GROUP", "FailedVendor", "LoadedVendor", "VendorPlugins"]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "hami.vendors"
DISABLE_ENV = "HAMI_DISABLED_VENDORS"

_SPEC_NAMES = tuple(name for name in dir(hookspecs) if name.startswith("hami_") and callable(getattr(hookspecs, name)))


@dataclass(frozen=True)
class LoadedVendor:
    """A vendor plugin that loaded: its metadata, where it came from, and which hooks it implements."""

    info: VendorInfo
    plugin: object
    distribution: str
    version: str
    hooks: tuple[str, ...]
    settings: Any = None

    @property
    def name(self) -> str:
        return self.info.name


@dataclass(frozen=True)
class FailedVendor:
    """A plugin that could not be loaded, and why."""

    entry_point: str
    distribution: str
    version: str
    error: str


@dataclass(frozen=True)
class DisabledVendor:
    entry_point: str
    distribution: str


@dataclass(frozen=True)
class PluginSource:
    """A plugin to load: an entry point's name, its distribution, and how to import it."""

    name: str
    distribution: str
    version: str
    load: Callable[[], object]


@dataclass
class VendorPlugins:
    """The loaded vendors and the typed facade over their hooks."""

    pm: pluggy.PluginManager
    vendors: list[LoadedVendor] = field(default_factory=list)
    failed: list[FailedVendor] = field(default_factory=list)
    disabled: list[DisabledVendor] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._kinds: dict[str, tuple[LoadedVendor, DeviceKind]] = {}
        self._resources: dict[str, DeviceKind] = {}
        self._callers: dict[tuple[str, str], Any] = {}
        self._warned_no_edits: set[str] = set()
        for vendor in self.vendors:
            self._index(vendor)

    # ---------------------------------------------------------------------------------------- loading

    @classmethod
    def load(
        cls,
        *,
        config: Mapping[str, Mapping[str, Any]] | None = None,
        disabled: Iterable[str] | None = None,
        strict: bool = False,
        sources: Iterable[PluginSource] | None = None,
    ) -> VendorPlugins:
        """Load every installed vendor plugin (or the given `sources`).

        :param config: vendor name → that vendor's configuration section.
        :param disabled: vendor names to skip; defaults to ``HAMI_DISABLED_VENDORS``.
        :param strict: raise `PluginError` on the first broken plugin instead of skipping it.
        :raises ConfigError: a vendor rejected its configuration section.
        """
        if disabled is None:
            disabled = [n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()]
        off = set(disabled)
        loaded = cls(pm=_new_manager())
        for source in installed_sources() if sources is None else sources:
            if source.name in off:
                log.info("vendor %s (%s) disabled by %s", source.name, source.distribution, DISABLE_ENV)
                loaded.disabled.append(DisabledVendor(source.name, source.distribution))
                continue
            try:
                plugin = source.load()
            except Exception as exc:  # a broken plugin must not take the others down
                loaded._fail(source, f"import failed: {type(exc).__name__}: {exc}", strict)
                continue
            loaded.add(plugin, source, config=config, strict=strict)
        return loaded

    @classmethod
    def from_plugins(
        cls,
        plugins: Mapping[str, object],
        *,
        config: Mapping[str, Mapping[str, Any]] | None = None,
        strict: bool = True,
    ) -> VendorPlugins:
        """The plugins of objects given directly (tests, the conformance kit, the demo)."""
        loaded = cls(pm=_new_manager())
        for name, plugin in plugins.items():
            source = PluginSource(name, getattr(plugin, "__name__", name), "", _constant(plugin))
            loaded.add(plugin, source, config=config, strict=strict)
        return loaded

    def add(
        self,
        plugin: object,
        source: PluginSource,
        *,
        config: Mapping[str, Mapping[str, Any]] | None = None,
        strict: bool = False,
    ) -> LoadedVendor | None:
        """Register one plugin, checking it against the contract; returns None when it was refused."""
        try:
            self.pm.register(plugin, name=source.name)
        except ValueError as exc:  # pluggy: already registered, or a name clash
            self._fail(source, f"registration failed: {exc}", strict)
            return None
        except pluggy.PluginValidationError as exc:
            self._fail(source, f"a hook does not match the contract: {exc}", strict)
            return None
        try:
            vendor = self._inspect(plugin, source, config or {})
        except ConfigError:
            self.pm.unregister(plugin)
            raise
        except (PluginError, Exception) as exc:
            self.pm.unregister(plugin)
            problem = exc.problem if isinstance(exc, PluginError) else f"{type(exc).__name__}: {exc}"
            self._fail(source, problem, strict)
            return None
        self.vendors.append(vendor)
        self._index(vendor)
        self._callers.clear()  # subset callers exclude only the plugins known when they were made
        log.debug("loaded vendor %s from %s %s", vendor.name, source.distribution, source.version)
        return vendor

    def _inspect(self, plugin: object, source: PluginSource, config: Mapping[str, Mapping[str, Any]]) -> LoadedVendor:
        impls = self.pm.get_hookcallers(plugin) or []
        hooks = tuple(sorted(caller.name for caller in impls))
        declared = _declared_hooks(plugin)
        for name in declared:
            if name not in _SPEC_NAMES:
                near = difflib.get_close_matches(name, _SPEC_NAMES, n=1)
                hint = f"; did you mean {near[0]}?" if near else ""
                raise PluginError(source.name, f"{name} is not a hook of the contract{hint}")
        for name in _SPEC_NAMES:  # the other way round: pluggy never calls an unmarked one, its feature silently absent
            if name not in declared and callable(getattr(plugin, name, None)):
                raise PluginError(source.name, f"{name} is a hook of the contract but is not marked @hookimpl")
        if "hami_vendor_info" not in hooks:
            raise PluginError(source.name, "does not implement hami_vendor_info, which every vendor must")
        info = self._call_one(plugin, "hami_vendor_info", {})
        if not isinstance(info, VendorInfo):
            raise PluginError(source.name, f"hami_vendor_info returned {type(info).__name__}, not VendorInfo")
        self._check_unique(info)
        settings = None
        if "hami_vendor_settings" in hooks:
            raw = config.get(info.name, {})
            try:
                settings = self._call_one(plugin, "hami_vendor_settings", {"raw": raw})
            except ValidationError as exc:
                model = _settings_model(plugin)
                raise ConfigError(describe(exc, model, "configuration", prefix=("vendors", info.name))) from exc
            except ValueError as exc:
                raise ConfigError(f"configuration of vendor {info.name!r} is invalid: {exc}") from exc
        return LoadedVendor(info, plugin, source.distribution, source.version, hooks, settings)

    def _check_unique(self, info: VendorInfo) -> None:
        for other in self.vendors:
            if other.name == info.name:
                raise PluginError(info.name, f"vendor name {info.name!r} is already taken by {other.distribution}")
        for kind in info.kinds:
            if kind.common_word in self._kinds:
                owner = self._kinds[kind.common_word][0]
                raise PluginError(
                    info.name, f"device kind {kind.common_word!r} is already served by vendor {owner.name}"
                )
            for resource in kind.resources.all():
                if resource in self._resources:
                    raise PluginError(
                        info.name,
                        f"resource {resource} is already claimed by kind {self._resources[resource].common_word}",
                    )

    def _fail(self, source: PluginSource, problem: str, strict: bool) -> None:
        if strict:
            raise PluginError(source.name, problem)
        log.error("vendor plugin %s from %s skipped: %s", source.name, source.distribution, problem)
        self.failed.append(FailedVendor(source.name, source.distribution, source.version, problem))

    def _index(self, vendor: LoadedVendor) -> None:
        for kind in vendor.info.kinds:
            self._kinds[kind.common_word] = (vendor, kind)
            for resource in kind.resources.all():
                self._resources[resource] = kind

    def _call_one(self, plugin: object, hook: str, kwargs: Mapping[str, Any]) -> Any:
        key = (hook, str(id(plugin)))
        caller = self._callers.get(key)
        if caller is None:
            others = [p for p in self.pm.get_plugins() if p is not plugin]
            caller = self.pm.subset_hook_caller(hook, remove_plugins=others)
            self._callers[key] = caller
        return caller(**kwargs)

    # ---------------------------------------------------------------------------------------- lookups

    def vendor(self, name: str) -> LoadedVendor:
        for vendor in self.vendors:
            if vendor.name == name:
                return vendor
        raise KeyError(f"no vendor named {name!r} is loaded")

    @property
    def kinds(self) -> list[DeviceKind]:
        return [kind for _, kind in self._kinds.values()]

    def kind(self, common_word: str) -> DeviceKind:
        return self._kinds[common_word][1]

    def owner(self, common_word: str) -> LoadedVendor:
        return self._kinds[common_word][0]

    def kind_of_resource(self, resource: str) -> DeviceKind | None:
        """The device kind a resource name belongs to, or None when no loaded vendor claims it."""
        return self._resources.get(resource)

    def implements(self, common_word: str, hook: str) -> bool:
        return hook in self.owner(common_word).hooks

    # ---------------------------------------------------------------------------------------- the facade

    def _routed(self, common_word: str, hook: str, **kwargs: Any) -> Any:
        vendor, kind = self._kinds[common_word]
        if hook not in vendor.hooks:
            return None
        return self._call_one(vendor.plugin, hook, {"kind": kind, "settings": vendor.settings, **kwargs})

    def discover(self) -> dict[str, list[NodeInventory]]:
        """Every vendor's discovery, by vendor name. A vendor whose discovery raises reports nothing."""
        found: dict[str, list[NodeInventory]] = {}
        for vendor in self.vendors:
            if "hami_discover_devices" not in vendor.hooks:
                continue
            try:
                answers = self._call_one(vendor.plugin, "hami_discover_devices", {"settings": vendor.settings})
                found[vendor.name] = [inventory for answer in answers for inventory in answer or ()]
            except Exception:
                log.exception("discovery of vendor %s failed; it reports no devices this round", vendor.name)
                found[vendor.name] = []
        return found

    def node_devices(
        self,
        common_word: str,
        annotations: Mapping[str, str],
        node: str = "",
        capacity: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[Device] | None:
        """The node's devices of `common_word` as its vendor reads its own node annotation (None: not such a kind)."""
        return self._routed(  # type: ignore[no-any-return]
            common_word,
            "hami_node_devices",
            annotations=annotations,
            node=node,
            capacity=capacity or {},
            labels=labels or {},
        )

    def container_request(self, common_word: str, container: Container, pod: Pod) -> ContainerRequest | None:
        """What `container` asks of device kind `common_word` (None when it does not mention the kind)."""
        kind = self.kind(common_word)
        if not container.mentions(kind.resources.all()):
            return None
        result: ContainerRequest | None = self._routed(
            common_word, "hami_container_request", container=container, pod=pod
        )
        return result

    def pod_requests(self, pod: Pod) -> dict[str, list[ContainerRequest | None]]:
        """Every kind the pod asks for → one request (or None) per container, init containers first."""
        containers = pod.all_containers
        out: dict[str, list[ContainerRequest | None]] = {}
        for index, container in enumerate(containers):
            for resource in (*container.limits, *container.requests):
                kind = self._resources.get(resource)
                if kind is None or (kind.common_word in out and out[kind.common_word][index] is not None):
                    continue
                request = self.container_request(kind.common_word, container, pod)
                if request is not None:
                    out.setdefault(kind.common_word, [None] * len(containers))[index] = request
        return out

    def admission_defaults(self, common_word: str, container: Container, pod: Pod) -> AdmissionEdit | None:
        result: AdmissionEdit | None = self._routed(
            common_word, "hami_admission_defaults", container=container, pod=pod
        )
        return result

    def fit_nodes(
        self,
        common_word: str,
        pod: Pod,
        requests: Sequence[ContainerRequest | None],
        nodes: Sequence[NodeView],
        policy: SchedulingPolicy,
    ) -> list[NodeFit]:
        """Fit the pod's requests of one kind onto all candidate nodes in one vendor call (a pod that asks for one
        island of linked devices: one call per round of islands, `hami.islands`)."""
        if not self.implements(common_word, "hami_fit_nodes"):
            reason = f"vendor {self.owner(common_word).name} cannot place {common_word} devices yet"
            return [NodeFit(node=n.name, reason=reason) for n in nodes]

        def fit(views: Sequence[NodeView]) -> list[NodeFit]:
            found = self._routed(common_word, "hami_fit_nodes", pod=pod, requests=requests, nodes=views, policy=policy)
            return list(found)

        if asks_island(pod):
            return fit_within_islands(fit, nodes, lambda view: self.device_islands(common_word, view))
        return fit(nodes)

    def device_islands(self, common_word: str, node: NodeView) -> Mapping[str, str] | None:
        """The islands of the node's devices of `common_word` (`hami_device_islands`; None: none known)."""
        result: Mapping[str, str] | None = self._routed(common_word, "hami_device_islands", node=node)
        return result

    def score_nodes(
        self,
        common_word: str,
        pod: Pod,
        fits: Sequence[NodeFit],
        nodes: Mapping[str, NodeView],
        policy: SchedulingPolicy,
    ) -> Mapping[str, float] | None:
        result: Mapping[str, float] | None = self._routed(
            common_word, "hami_score_nodes", pod=pod, fits=fits, nodes=nodes, policy=policy
        )
        return result

    def device_processes(self, common_word: str) -> list[DeviceProcess] | None:
        """The processes on this node's devices of kind `common_word` (`hami_device_processes`); None when the
        vendor does not say (no hook, or not this round)."""
        result = self._routed(common_word, "hami_device_processes")
        return None if result is None else list(result)

    def drm_usage_source(self, common_word: str) -> DrmUsageSource | None:
        """Where the kernel's DRM client statistics describe the devices of kind `common_word`
        (`hami_drm_usage_source`); None when the vendor reads none."""
        result: DrmUsageSource | None = self._routed(common_word, "hami_drm_usage_source")
        return result

    def device_readings(self, common_word: str) -> list[DeviceReading] | None:
        """What the management library reads from this node's devices of kind `common_word` now
        (`hami_device_readings`); None when the vendor does not say (no hook, or not this round)."""
        result = self._routed(common_word, "hami_device_readings")
        return None if result is None else list(result)

    def simulated_devices(
        self, common_word: str, devices: Sequence[Device], driver: Mapping[str, Mapping[str, Any]]
    ) -> None:
        """Tell the vendor of `common_word` its simulated devices and their driver facts (`hami_simulated_devices`)."""
        self._routed(common_word, "hami_simulated_devices", devices=devices, driver=driver)

    def dra_device(self, common_word: str, device: Device) -> DraDevice:
        """The vendor's DRA facts about `device` (`hami_dra_device`); core's defaults when it gives none."""
        result = self._routed(common_word, "hami_dra_device", device=device)
        return DraDevice() if result is None else result

    def allocate(self, common_word: str, pod: Pod, container_index: int, devices: ContainerPlacement) -> Allocation:
        """The vendor's allocation of one container, always as an `Allocation`: a bare placement answer gets no
        annotations, no answer keeps `devices`."""
        result = self._routed(common_word, "hami_allocate", pod=pod, container_index=container_index, devices=devices)
        if result is None:
            return Allocation(devices=devices)
        if isinstance(result, Allocation):
            return result
        return Allocation(devices=tuple(result))

    def release(self, common_word: str, pod: Pod, placements: Sequence[ContainerPlacement]) -> None:
        self._routed(common_word, "hami_release", pod=pod, placements=placements)

    def reconcile(self, common_word: str, pods: Sequence[Pod]) -> None:
        """The vendor's clean-up after a daemon restart, given the pods still on this node (`hami_reconcile`)."""
        self._routed(common_word, "hami_reconcile", pods=pods)

    def container_edits(
        self,
        common_word: str,
        pod: Pod,
        container_index: int,
        devices: ContainerPlacement,
        library: IsolationLibrary | None = None,
    ) -> ContainerEdits:
        result = self._routed(
            common_word,
            "hami_container_edits",
            pod=pod,
            container_index=container_index,
            devices=devices,
            library=library,
        )
        vendor = self._kinds[common_word][0]
        if devices and "hami_container_edits" not in vendor.hooks and vendor.name not in self._warned_no_edits:
            self._warned_no_edits.add(vendor.name)  # once per vendor: every container of the kind gets the same
            log.warning(
                "vendor %s (%s) implements no hami_container_edits: containers given %s devices get no environment,"
                " mounts or device nodes from it (implement the hook to name the devices the container may use)",
                vendor.name,
                vendor.distribution,
                common_word,
            )
        return ContainerEdits() if result is None else result

    def doctor_checks(self, grant_of: Callable[[str], Any] | None) -> list[Finding]:
        """Every vendor's `hami_doctor_checks`, each finding marked with its vendor. `grant_of` gives a vendor's
        grant by vendor name in a container (None on a node: every vendor is asked with no grant; in a container,
        only the vendors `grant_of` has a grant for). A vendor whose hook raises gets one failed finding saying so."""
        findings: list[Finding] = []
        for vendor in self.vendors:
            if "hami_doctor_checks" not in vendor.hooks:
                continue
            grant = grant_of(vendor.name) if grant_of is not None else None
            if grant_of is not None and grant is None:
                continue
            try:
                answers = self._call_one(
                    vendor.plugin, "hami_doctor_checks", {"settings": vendor.settings, "grant": grant}
                )
                found = [f for answer in answers for f in answer or ()]
            except Exception as exc:  # a plugin's bug is one finding, not the end of the report
                log.debug("hami_doctor_checks of vendor %s raised", vendor.name, exc_info=True)
                fix = f"report this to the maintainers of {vendor.distribution} {vendor.version}"
                found = [Finding("vendor checks", Status.FAILED, f"{type(exc).__name__}: {exc}", fix)]
            findings += [Finding(f.check, f.status, f.detail, f.fix, vendor.name) for f in found]
        return findings

    def host_environment(
        self, common_word: str, devices: ContainerPlacement, indices: Sequence[int]
    ) -> dict[str, str] | None:
        """What a host process needs to see exactly `devices` (`hami run`); None when the vendor cannot say."""
        result = self._routed(common_word, "hami_host_environment", devices=devices, indices=indices)
        return None if result is None else dict(result)


def _settings_model(plugin: object) -> type[BaseModel] | None:
    """The settings model a plugin's `hami_vendor_settings` says it returns (its return annotation), so that a
    configuration error can list the legal keys and the nearest one; None when it does not say."""
    hook = getattr(plugin, "hami_vendor_settings", None)
    if hook is None:
        return None
    try:
        returned = typing.get_type_hints(hook).get("return")
    except Exception:  # an annotation that does not resolve: the error keeps its plain form
        return None
    return returned if isinstance(returned, type) and issubclass(returned, BaseModel) else None


def _constant(plugin: object) -> Callable[[], object]:
    return lambda: plugin


def _new_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def _declared_hooks(plugin: object) -> list[str]:
    """Names of the plugin's attributes marked as hook implementations (to catch misspelled hooks)."""
    marker = f"{hookspecs.PROJECT}_impl"
    names = []
    for name in dir(plugin):
        try:
            attr = getattr(plugin, name)
        except Exception:
            continue
        if callable(attr) and hasattr(attr, marker):
            names.append(name)
    return names


def installed_sources() -> list[PluginSource]:
    """The installed entry points of group ``hami.vendors``, one per name (first distribution wins)."""
    seen: dict[str, PluginSource] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        source = PluginSource(
            name=ep.name,
            distribution=dist.metadata["Name"] if dist is not None else "?",
            version=dist.version if dist is not None else "?",
            load=ep.load,
        )
        seen.setdefault(ep.name, source)
    return sorted(seen.values(), key=lambda s: s.name)
