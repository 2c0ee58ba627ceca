"""Reading device requests out of container resources: the building block every vendor's request hook uses.

Owns HAMi's shared rules (protocol.md section 1): values come from `limits`, falling back to `requests`;
memory and cores are per device; a container asking only for memory or cores gets one device; a count with
neither memory nor cores is a whole device (all its memory, exclusive cores) unless a default memory is
configured. Vendor quirks (legal memory steps, whole-card-only multi-device requests) stay in the vendor,
applied to what this returns.

Values HAMi v2.10 accepts and normalises are normalised the same way (`pkg/device/*`, `GenerateResourceRequests`
and `Fit`): cores above 100 are 100 (the whole device's compute), a memory percentage beside an absolute memory
is ignored (the absolute memory wins), and a memory percentage of 0 counts as not given. The admission webhook
tells the user what changed (`share_normalisations`).

Bad values raise `RequestError` naming the resource and the fix; `gpumem: 3Gi` is refused rather than read
as three billion MiB. Decimal-suffixed integers are read as the integers they are (`3k` is 3000), because the
API server stores extended resources in canonical form: a pod written with `gpumem: "3000"` arrives as `3k`.
"""

from __future__ import annotations

import re

from pydantic import Field

from hami.errors import RequestError
from hami.model import Container, ContainerRequest, DeviceKind
from hami.quantity import parse_quantity
from hami.vendorstate import VendorSettings

__all__ = ["ShareDefaults", "read_count", "read_share_request", "share_normalisations"]


class ShareDefaults(VendorSettings):
    """HAMi's request defaults (`defaultMem`, `defaultCores`) on the vendor settings base, for a vendor's settings
    model to subclass (`read_share_request` takes them as `defaults`).

    A vendor adds its own keys, or overrides a default (Cambricon's cores default to a whole device)."""

    default_memory: int = Field(
        default=0,
        ge=0,
        validation_alias="defaultMem",
        description="MiB when a count comes alone",
    )
    default_cores: int = Field(default=0, ge=0, le=100, description="percent when memory is given without cores")


_PLAIN_INT = re.compile(r"^\+?[0-9]+$")
_DECIMAL_SI = re.compile(r"^\+?[0-9]+(?:\.[0-9]+)?[kMGTPE]$")
"""The API server's canonical form of a large integer written plainly (`3k`, `15k`, `1M`): decimal, never binary."""
_WITH_UNIT = re.compile(r"^\+?([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]+)$")
_BINARY_MIB = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}


def read_count(container: Container, resource: str, *, unit: str = "", limit: int | None = None) -> int | None:
    """The plain non-negative integer value of `resource`, or None when the container does not mention it.

    `unit` names what one unit is (`MiB`, `256 MiB`, `percent`) for the error message; `limit` is the largest
    legal value.
    """
    raw = container.resource(resource)
    if raw is None:
        return None
    text = raw.strip()
    if _DECIMAL_SI.match(text):
        try:
            exact = parse_quantity(text)
        except ValueError as exc:  # beyond what a Kubernetes quantity holds (10E)
            raise RequestError(resource, raw, str(exc).removeprefix(f"{text!r} ")) from None
        if exact != exact.to_integral_value():
            raise RequestError(resource, raw, _fix_for(text, unit))
        text = str(int(exact))
    if not _PLAIN_INT.match(text):
        raise RequestError(resource, raw, _fix_for(text, unit))
    try:
        value = int(text)
    except ValueError:  # more digits than int() converts
        raise RequestError(resource, raw, "is out of range") from None
    if limit is not None and value > limit:
        raise RequestError(resource, raw, f"is more than {limit}{' ' + unit if unit else ''}, the largest legal value")
    return value


def _fix_for(text: str, unit: str) -> str:
    what = f"counts {unit}" if unit else "counts whole units"
    m = _WITH_UNIT.match(text)
    if m and unit == "MiB" and m.group(2) in _BINARY_MIB:
        mib = float(m.group(1)) * _BINARY_MIB[m.group(2)]
        if mib.is_integer():
            return f"is not a plain number: this resource {what}, so write {int(mib)}"
    return f"is not a plain non-negative integer: this resource {what}"


def read_share_request(
    kind: DeviceKind,
    container: Container,
    *,
    defaults: ShareDefaults | None = None,
    default_memory: int = 0,
    default_cores: int = 0,
    max_count: int = 1024,
) -> ContainerRequest | None:
    """The container's request for `kind` under HAMi's shared rules, or None when it asks for none.

    `default_memory` (MiB) applies when a count is given without memory; `default_cores` when cores are
    not given (and memory is); `defaults` (a vendor's settings) gives both. Memory is converted from the
    resource's unit to MiB.
    """
    if defaults is not None:
        default_memory, default_cores = defaults.default_memory, defaults.default_cores
    names = kind.resources
    count = read_count(container, names.count, unit="devices", limit=max_count)
    unit = "MiB" if names.memory_unit_mib == 1 else f"{names.memory_unit_mib} MiB"
    memory_units = read_count(container, names.memory, unit=unit) if names.memory else None
    percentage = (
        read_count(container, names.memory_percentage, unit="percent", limit=100) if names.memory_percentage else None
    )
    cores = read_count(container, names.cores, unit="percent") if names.cores else None
    if cores is not None and cores > 100:
        cores = 100
    if percentage == 0 or (percentage is not None and memory_units):
        percentage = None

    if count == 0 or (count is None and not memory_units and not percentage and not cores):
        return None
    if count is None:
        count = 1
    memory = (memory_units or 0) * names.memory_unit_mib
    if not memory and percentage is None:
        if default_memory:
            memory = default_memory
        else:
            percentage = 100
            if cores is None:
                cores = 100
    return ContainerRequest(
        kind=kind.common_word,
        count=count,
        memory=memory,
        memory_percentage=percentage,
        cores=default_cores if cores is None else cores,
    )


def share_normalisations(kind: DeviceKind, container: Container) -> list[str]:
    """What `read_share_request` changes in the container's values for `kind`, one sentence each (for the
    admission response's warnings); empty when it takes them as written. Unreadable values are not described
    here: reading them raises."""
    names = kind.resources
    out: list[str] = []
    try:
        cores = read_count(container, names.cores) if names.cores else None
        memory = read_count(container, names.memory) if names.memory else None
        percentage = read_count(container, names.memory_percentage) if names.memory_percentage else None
    except RequestError:
        return out
    if cores is not None and cores > 100:
        out.append(f"{names.cores}: {cores} is more than 100 percent; read as 100 (the whole device's compute)")
    if percentage and memory:
        out.append(f"{names.memory_percentage}: {percentage} is ignored because {names.memory} is given ({memory})")
    elif percentage == 0:
        out.append(f"{names.memory_percentage}: 0 is read as not given")
    return out
