"""Kubernetes resource quantities (`500m`, `2`, `16Gi`, `1.5G`, `1e3`) as the numbers the scheduler counts.

Owns turning the quantity syntax of the Kubernetes API into CPU millicores and memory MiB (rounded up, as a
request must never be under-counted). The syntax itself is the Kubernetes client's (`kubernetes.utils.
parse_quantity`); this module bounds what it is given and what it returns. Malformed values raise `ValueError`
naming the value.
"""

from __future__ import annotations

import math
from decimal import Decimal

from kubernetes.utils import parse_quantity as kubernetes_quantity

__all__ = ["cpu_millis", "memory_mib", "parse_quantity"]

_LONGEST = 64
"""Longer strings are refused before parsing: no real quantity is that long, and exponents such as `1e999999999`
would otherwise make the rounding below build a number of a billion digits."""
_LARGEST = Decimal(2) ** 63
"""Kubernetes' own bound: a Quantity's value fits an int64."""


def parse_quantity(value: str | int | float) -> Decimal:
    """The quantity's value in base units (cores, bytes), through the Kubernetes client's own parser.

    :raises ValueError: naming the value, for what is not a quantity or is beyond what Kubernetes stores."""
    text = str(value).strip()
    problem = f"{value!r} is not a Kubernetes quantity (e.g. 500m, 2, 16Gi)"
    if len(text) > _LONGEST:
        raise ValueError(problem)
    try:
        number = Decimal(kubernetes_quantity(text))
    except (ValueError, ArithmeticError):
        raise ValueError(problem) from None
    if not number.is_finite() or number.adjusted() > 18 or abs(number) > _LARGEST:  # adjusted(): no overflow
        raise ValueError(f"{value!r} is out of range for a Kubernetes quantity")
    return number


def cpu_millis(value: str | int | float) -> int:
    return math.ceil(parse_quantity(value) * 1000)


def memory_mib(value: str | int | float) -> int:
    return math.ceil(parse_quantity(value) / (2**20))
