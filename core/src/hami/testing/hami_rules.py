"""HAMi v2.10's scheduler rules that a registration must pass, written from its source for vendors' tests to hold
their node daemons to them (a registration HAMi's scheduler would not count fails a mixed fleet).

`counted_by_hami`: `getNodeResources` (`pkg/scheduler/score.go`) keeps, for a request of a kind, only the node's
devices whose registered type contains the request's type (the kind's common word: `NVIDIA`, `DCU`, `MLU`,
`Mthreads`, `Metax-GPU`, `Metax-SGPU`, each Ascend and Iluvatar common word), both lower-cased. A device that
fails it is never offered by HAMi's scheduler: a pod of that kind gets `NodeInsufficientDevice` on the node.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["counted_by_hami"]


def counted_by_hami(registered_types: Iterable[str], common_word: str) -> bool:
    """Whether HAMi's scheduler counts every one of these registered types for a request of `common_word`."""
    types = list(registered_types)
    return bool(types) and all(common_word.lower() in t.lower() for t in types)
