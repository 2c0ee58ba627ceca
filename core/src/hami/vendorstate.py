"""A vendor's settings: the one dialect of every vendor's configuration section, and its node-side state.

Owns `VendorSettings`, the base of every vendor's settings model (``class NvidiaSettings(VendorSettings)``, or
`hami.requests.ShareDefaults`, which adds HAMi's ``defaultMem``/``defaultCores``), which says once how a section
is read:

- each key is accepted in HAMi's camelCase (``deviceSplitCount``) and as the field's own name
  (``device_split_count``), and nothing else: a misspelled key is refused with its name and the nearest legal one
  (`hami.validation`), and an error names a key as the file spells it. The camelCase is made from the field's
  name (`camel`); a field whose HAMi name is not that declares HAMi's spelling alone (its own name is still read):
  ``Field(validation_alias="defaultGPUNum")``, or ``AliasChoices("defaultMemory", "defaultMem")`` for a key HAMi
  spelt two ways, the first being the one messages show;
- settings are frozen once read;
- it holds one runtime object (an open driver session, the devices last read) for as long as the `VendorPlugins`
  that loaded those settings live, so two of them (two tests, the simulator beside a daemon) never share one, and
  creates it on first use under a lock (`VendorSettings.runtime_of`).

Also `devices_named`, how a vendor's node runtime turns the device names of a placement into the devices of its
last read (read again once when one is not among them, refused with what the node has when one is not there), and
`driver_fact`, how a vendor reads one of the facts a simulated inventory gives in place of its driver
(`hami_simulated_devices`), with the error that says what to add. Must not hold any vendor's option: those are
the vendor's fields.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import AliasGenerator, BaseModel, ConfigDict, PrivateAttr

from hami.errors import HamiError

__all__ = ["VendorSettings", "camel", "capacity_index", "devices_named", "driver_fact", "trailing_index"]

R = TypeVar("R")
D = TypeVar("D")
F = TypeVar("F", int, str)
_attaching = threading.Lock()


def camel(name: str) -> str:
    """HAMi's spelling of a field name: ``device_split_count`` → ``deviceSplitCount``."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class VendorSettings(BaseModel):
    """The base of a vendor's settings model: HAMi's camelCase keys and the fields' names, frozen, with the host's
    node-side runtime (see the module)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=AliasGenerator(validation_alias=camel),
        validate_by_alias=True,
        validate_by_name=True,
    )

    _runtime: Any = PrivateAttr(default=None)

    @property
    def runtime(self) -> Any:
        """The runtime attached to these settings (`runtime_of`), or None before its first use."""
        return self._runtime

    def runtime_of(self, kind: type[R], make: Callable[[], R]) -> R:
        """The runtime of type `kind` attached to these settings, made by `make` on first use."""
        with _attaching:
            if not isinstance(self._runtime, kind):
                self._runtime = make()
            runtime: R = self._runtime
            return runtime


_TRAILING_INDEX = re.compile(r".+-([0-9]+)", re.DOTALL)


def capacity_index(name: str, word: str) -> int | None:
    """The index in HAMi's name for a device it counts from a node's capacity, ``<node>-<word>-<index>``
    (``gpu-1-metax-3``); None when `name` is not one."""
    match = re.fullmatch(rf".+-{re.escape(word)}-([0-9]+)", name, re.DOTALL)
    return int(match.group(1)) if match else None


def trailing_index(name: str) -> int | None:
    """The number after the last ``-`` of `name` (HAMi's capacity names, a simulated inventory's ``<id>-<index>``);
    None when there is none."""
    match = _TRAILING_INDEX.fullmatch(name)
    return int(match.group(1)) if match else None


def devices_named(
    names: Sequence[str],
    last_read: Sequence[D],
    read_again: Callable[[], Sequence[D]],
    *,
    what: str,
    name_of: Callable[[D], str],
    answers: Callable[[D, str], bool] | None = None,
    stand_in: Callable[[str], D | None] | None = None,
) -> list[D]:
    """The devices a placement names, in its order: among `last_read` (the devices of the node's last read), else
    among those `read_again` reads now (called at most once, and only when a name is not among the last read).

    :param what: the kind of device in messages (``Hygon DCU``).
    :param name_of: a device's name as this node lists it in a refusal (its UUID).
    :param answers: whether a device answers to a name; by default when `name_of` is the name (a vendor adds
        HAMi's capacity names, ``<node>-<kind>-<index>``, here).
    :param stand_in: a device for a name no device answers to, or None (a node with no driver at all, whose
        devices are only names).
    :raises HamiError: a name no device of this node answers to, with what the node has: the pod was placed from an
        outdated view.
    """
    match = answers or (lambda device, name: name_of(device) == name)

    def find(devices: Sequence[D]) -> dict[str, D]:
        return {n: d for n in names for d in reversed(devices) if match(d, n)}  # reversed: the first one wins

    devices = last_read
    found = find(devices)
    if len(found) < len(set(names)):
        devices = read_again()
        found = find(devices)
    for name in names:
        if name not in found and stand_in is not None and (device := stand_in(name)) is not None:
            found[name] = device
    missing = [n for n in names if n not in found]
    if missing:
        known = ", ".join(sorted(name_of(d) for d in devices)) or f"no {what}"
        raise HamiError(f"{what} {', '.join(missing)} is not on this node (it has {known}): the pod was placed from "
                        "an outdated view")  # fmt: skip
    return [found[n] for n in names]


def driver_fact(driver: Mapping[str, Mapping[str, Any]], device: str, key: str, expected: type[F]) -> F:
    """The fact `key` of simulated device `device`, from `hami_simulated_devices`' `driver` mapping.

    :raises HamiError: the inventory gives no such fact for the device, or one of another type."""
    value = driver.get(device, {}).get(key)
    word = "an integer" if expected is int else "a string"
    if value is None:
        raise HamiError(f"device {device} has no driver.{key} ({word}) in the simulated inventory: add it")
    if not isinstance(value, expected) or isinstance(value, bool):
        raise HamiError(f"device {device}: driver.{key} is {value!r} in the simulated inventory, not {word}")
    return value
