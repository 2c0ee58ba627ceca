"""Kubernetes resource quantities (`500m`, `2`, `16Gi`, `1.5G`, `1e3`) as the numbers the scheduler counts.

Owns turning the quantity syntax of the Kubernetes API into CPU millicores and memory MiB (rounded up, as a
request must never be under-counted). The syntax is apimachinery's (`resource.ParseQuantity`): a signed decimal
number, then a binary suffix (Ki … Ei), a decimal one (n, u, m, k, M … E, or none) or an exponent (e3, E-2).
Every process that reads a pod reads quantities, and the `kubernetes` client's parser (`kubernetes.utils.
parse_quantity`, the same values on that syntax: tests/core/test_quantity.py holds the two together) came with the
whole client: 0.3-0.5 s and 13 MiB of every process's start for one function. Malformed values raise `ValueError`
naming the value.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

__all__ = ["cpu_millis", "memory_mib", "parse_quantity"]

_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>[KMGTPE]i)|(?P<exponent>[eE][+-]?[0-9]+)|(?P<decimal>[numkMGTPE]?))"
)
_BINARY = {"K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
"""Powers of 1024."""
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
"""Powers of ten."""
_LONGEST = 64
"""Longer strings are refused before parsing: no real quantity is that long, and exponents such as `1e999999999`
would otherwise make the rounding below build a number of a billion digits."""
_LARGEST = Decimal(2) ** 63
"""Kubernetes' own bound: a Quantity's value fits an int64."""


def _parse(text: str) -> Decimal | None:
    """The value of a quantity in apimachinery's syntax; None for anything else."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        return None
    if match["exponent"]:
        return Decimal(text)  # the number and its exponent, exactly
    number = Decimal(match["number"])
    if match["binary"]:
        return number * Decimal(1024 ** _BINARY[match["binary"][0]])
    power = _DECIMAL[match["decimal"]]
    return number * (Decimal(10) ** power) if power else number  # rounded (28 digits) as the client rounds


def parse_quantity(value: str | int | float) -> Decimal:
    """The quantity's value in base units (cores, bytes).

    :raises ValueError: naming the value, for what is not a quantity or is beyond what Kubernetes stores."""
    text = str(value).strip()
    problem = f"{value!r} is not a Kubernetes quantity (e.g. 500m, 2, 16Gi)"
    if len(text) > _LONGEST:
        raise ValueError(problem)
    number = _parse(text)
    if number is None:
        raise ValueError(problem)
    if not number.is_finite() or number.adjusted() > 18 or abs(number) > _LARGEST:  # adjusted(): no overflow
        raise ValueError(f"{value!r} is out of range for a Kubernetes quantity")
    return number


def cpu_millis(value: str | int | float) -> int:
    return math.ceil(parse_quantity(value) * 1000)


def memory_mib(value: str | int | float) -> int:
    return math.ceil(parse_quantity(value) / (2**20))
