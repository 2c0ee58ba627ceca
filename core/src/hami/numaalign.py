"""NUMA alignment: the pod annotation ``hami.io/numa-alignment`` and what its value means.

Owns the annotation's name, its two values and their parser, as HAMi (PRs #2729 and #2731, after v2.10) reads
them: ``best-effort`` or ``strict``, compared after trimming surrounding whitespace and lowering the case (Go's
``strings.TrimSpace`` and ``strings.ToLower``, rune by rune); an annotation that is absent means no alignment
(today's behaviour); any other value, the empty one included, is an error. The error says what to write instead.

What the values do is decided by the parts that read them, each saying so in its own docstring:

* the device choice (`hami.fitting.ShareFitter`): ``strict`` places a container asking for several devices on
  devices of one NUMA node, or refuses the node with a reason; ``best-effort`` prefers such a set and takes the
  policy's own choice when no NUMA node holds one;
* the node daemon's GetPreferredAllocation (`hami.node`): both steer the kubelet to the devices the scheduler
  placed; where the kubelet's Topology Manager offers none of them, ``strict`` fails the container's admission
  rather than run it beside CPUs of another NUMA node, ``best-effort`` keeps the kubelet's own choice;
* the admission webhook refuses a pod whose value is not one of the two.

A pure leaf: no Kubernetes, no model. A tenant may write this annotation on its own pod; every value only narrows
where that pod may run, never what it or another pod is granted.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from enum import StrEnum

from hami.errors import HamiError
from hami.validation import nearest

__all__ = ["NUMA_ALIGNMENT_ANNOTATION", "NumaAlignment", "NumaAlignmentError", "numa_alignment", "parse_numa_alignment"]

NUMA_ALIGNMENT_ANNOTATION = "hami.io/numa-alignment"


class NumaAlignment(StrEnum):
    """The annotation's values."""

    BEST_EFFORT = "best-effort"
    """Prefer devices of one NUMA node; never refuse a placement or an admission for want of one."""
    STRICT = "strict"
    """Devices of one NUMA node, or no placement (and, on the node, no start beside CPUs of another node)."""


class NumaAlignmentError(HamiError, ValueError):
    """The annotation holds a value that is neither ``best-effort`` nor ``strict``; the message says what to write."""

    def __init__(self, value: str) -> None:
        self.value = value
        hint = nearest(_normalise(value), list(NumaAlignment))
        spelled = f' (did you mean "{hint}"?)' if hint else ""
        super().__init__(
            f'{NUMA_ALIGNMENT_ANNOTATION} is {value!r}{spelled}: write "best-effort" (prefer devices of one NUMA '
            'node) or "strict" (devices of one NUMA node, or no placement), or remove the annotation for no alignment'
        )


# Go's unicode.IsSpace: what strings.TrimSpace removes (Python's str.strip also removes U+001C-U+001F, which Go keeps)
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"  # noqa: E501
# Go's unicode.ToLower maps one rune to one rune: U+0130 (İ) becomes "i", where Python's str.lower gives "i̇"
_GO_LOWER = str.maketrans({"\u0130": "i"})


def _normalise(value: str) -> str:
    return value.strip(_GO_SPACE).translate(_GO_LOWER).lower()


@functools.lru_cache(maxsize=64)
def parse_numa_alignment(value: str) -> NumaAlignment:
    """The alignment a value of the annotation asks for.

    :raises NumaAlignmentError: the value is neither ``best-effort`` nor ``strict`` (in any case, with any
        surrounding whitespace)."""
    normal = _normalise(value)
    if normal == NumaAlignment.BEST_EFFORT:
        return NumaAlignment.BEST_EFFORT
    if normal == NumaAlignment.STRICT:
        return NumaAlignment.STRICT
    raise NumaAlignmentError(value)


def numa_alignment(annotations: Mapping[str, str]) -> NumaAlignment | None:
    """The alignment a pod's annotations ask for; None when they carry no ``hami.io/numa-alignment``.

    :raises NumaAlignmentError: the annotation holds another value."""
    value = annotations.get(NUMA_ALIGNMENT_ANNOTATION)
    return None if value is None else parse_numa_alignment(value)
