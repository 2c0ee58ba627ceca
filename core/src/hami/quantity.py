"""Kubernetes resource quantities (`500m`, `2`, `16Gi`, `1.5G`, `1e3`) as the numbers the scheduler counts.

Owns parsing the quantity syntax of the Kubernetes API into CPU millicores and memory MiB (rounded up, as
a request must never be under-counted). Malformed values raise `ValueError` naming the value.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

__all__ = ["cpu_millis", "memory_mib", "parse_quantity"]

_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$")


def parse_quantity(value: str | int | float) -> Decimal:
    """The quantity's value in base units (cores, bytes)."""
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 2, 16Gi)")
    try:
        return Decimal(match.group(1)) * _SUFFIX[match.group(2)]
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 2, 16Gi)") from None


def cpu_millis(value: str | int | float) -> int:
    return math.ceil(parse_quantity(value) * 1000)


def memory_mib(value: str | int | float) -> int:
    return math.ceil(parse_quantity(value) / (2**20))
