"""Dynamic sMLU on the node: the driver-enforced slice of one card made for a container at Allocate, and undone.

Owns what Cambricon's dynamic-sMLU device plugin does on the host, through CNDev (`hami_vendor_cambricon.cndev`):

* `create`: for a container granted a *share* of one card (less than its whole compute or memory), an sMLU
  instance with exactly the granted compute quota (percent) and memory (the placement's MiB, in bytes). As
  Cambricon's plugin does, a profile of that quota and memory is reused when the card has one with room left,
  else made; then an instance of it is made. The size comes from the placement the scheduler recorded (signed
  when placement keys are set), never from the pod's ``CAMBRICON_DSMLU_PROFILE`` annotation, which the pod's
  owner may rewrite.
* The instance is named after the container, ``hami-<pod uid>-<container index>`` (`instance_name`). The driver
  keeps the names, so the node needs no state of its own: a retried Allocate finds the instance it made, a
  restarted daemon finds what its predecessor made, and instances not named so (made by other tools) are never
  touched.
* `release`: a finished pod's instances destroyed, and the profiles they used once no instance is left on them.
* `reconcile`: after a restart, the instances of pods that are no longer on this node destroyed (a pod deleted
  while the daemon was down, an Allocate that died half-way).

Errors are `hami.errors.HamiError` saying what to fix (sMLU mode off, no room left on the card, a driver refusal
with CNDev's code).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from hami.errors import HamiError
from hami_vendor_cambricon.cndev import Cndev, CndevError, MluCard, SmluInstance

__all__ = ["PREFIX", "create", "instance_name", "instance_of", "owner_of", "reconcile", "release"]

log = logging.getLogger("hami_vendor_cambricon")

PREFIX = "hami-"
_UID = re.compile(r"[0-9a-z][0-9a-z-]{0,62}")
_NAME = re.compile(r"hami-([0-9a-z][0-9a-z-]{0,62})-([0-9]{1,4})")
MIB = 1024 * 1024


def instance_name(pod_uid: str, container_index: int) -> str:
    """The instance name of a container (``hami-<pod uid>-<container index>``).

    :raises HamiError: the pod has no UID of Kubernetes' form (lower-case letters, digits, ``-``).
    """
    if not _UID.fullmatch(pod_uid):
        raise HamiError(f"pod UID {pod_uid!r} is not of Kubernetes' form, so no sMLU instance can be named for it")
    return f"{PREFIX}{pod_uid}-{container_index}"


def owner_of(name: str) -> str | None:
    """The pod UID an instance name belongs to; None for instances this daemon did not make."""
    match = _NAME.fullmatch(name)
    return match.group(1) if match else None


def instance_of(cndev: Cndev, card: int, name: str) -> SmluInstance | None:
    for instance in cndev.instances(card):
        if instance.name == name:
            return instance
    return None


def create(cndev: Cndev, card: MluCard, name: str, quota: int, memory_mib: int) -> tuple[SmluInstance, bool]:
    """The instance `name` on `card` with `quota` percent and `memory_mib` MiB: the one made before (Allocate
    retried), else a new one; and whether it is new.

    :raises HamiError: the share cannot be made (see the module's docstring).
    """
    what = f"MLU {card.index} ({card.uuid})"
    if not 1 <= quota <= 100:
        raise HamiError(f"{what}: a dynamic-sMLU share needs a compute quota of 1 to 100 percent, not {quota}")
    if memory_mib <= 0:
        raise HamiError(f"{what}: a dynamic-sMLU share needs memory (cambricon.com/mlu.smlu.vmemory)")
    try:
        if not cndev.smlu_enabled(card.index):
            raise HamiError(
                f"{what} is not in sMLU mode, so no share of it can be made: turn the card's sMLU mode on "
                "(cndevSetSMLUMode) or ask for whole cards"
            )
        existing = instance_of(cndev, card.index, name)
        if existing is not None:
            return existing, False
        memory = memory_mib * MIB
        profile = next((p for p in cndev.profiles(card.index) if (p.quota, p.memory_bytes) == (quota, memory)), None)
        if profile is not None and profile.remaining < 1:
            raise HamiError(f"{what} has no room left for another sMLU of {quota} % and {memory_mib} MiB")
        profile_id = profile.id if profile is not None else cndev.create_profile(card.index, quota, memory)
        handle = cndev.create_instance(card.index, profile_id, name)
    except CndevError as exc:
        raise HamiError(f"making an sMLU of {quota} % and {memory_mib} MiB on {what} failed: {exc}") from None
    try:
        made = instance_of(cndev, card.index, name)
    except CndevError as exc:
        made, problem = None, str(exc)
    else:
        problem = "CNDev does not list it"
    if made is None or made.handle != handle:
        _destroy(cndev, handle)
        raise HamiError(f"the sMLU made on {what} (handle {handle}) cannot be read back: {problem}")
    log.info("sMLU %s made on %s: %d %%, %d MiB, %s", name, what, quota, memory_mib, made.device_node)
    return made, True


def _destroy(cndev: Cndev, handle: int) -> bool:
    try:
        cndev.destroy_instance(handle)
        return True
    except CndevError as exc:
        log.error("destroying sMLU instance %d failed: %s", handle, exc)
        return False


def _remove(cndev: Cndev, card: int, gone: list[SmluInstance]) -> int:
    """Destroy `gone` (instances of `card`), then the profiles they used that have no instance left."""
    done = [i for i in gone if _destroy(cndev, i.handle)]
    for instance in done:
        log.info("sMLU %s on MLU %d destroyed", instance.name, card)
    used = {i.profile_id for i in done}
    try:
        left = {i.profile_id for i in cndev.instances(card)}
        for profile in used - left:
            cndev.destroy_profile(card, profile)
    except CndevError as exc:
        log.warning("cleaning the sMLU profiles of MLU %d failed: %s", card, exc)
    return len(done)


def _ours(cndev: Cndev, cards: Iterable[MluCard]) -> Iterable[tuple[int, list[SmluInstance]]]:
    for card in cards:
        try:
            if not cndev.smlu_enabled(card.index):
                continue
            yield card.index, [i for i in cndev.instances(card.index) if owner_of(i.name) is not None]
        except CndevError as exc:
            log.warning("cannot list the sMLU instances of MLU %d: %s", card.index, exc)


def release(cndev: Cndev, cards: Iterable[MluCard], pod_uid: str) -> int:
    """Destroy every sMLU instance of the pod (and profiles left empty); how many."""
    count = 0
    for card, instances in _ours(cndev, cards):
        count += _remove(cndev, card, [i for i in instances if owner_of(i.name) == pod_uid])
    return count


def reconcile(cndev: Cndev, cards: Iterable[MluCard], live_pods: Iterable[str]) -> int:
    """Destroy the sMLU instances this daemon made for pods not in `live_pods` (UIDs); how many."""
    alive = set(live_pods)
    count = 0
    for card, instances in _ours(cndev, cards):
        stale = [i for i in instances if owner_of(i.name) not in alive]
        for instance in stale:
            log.warning("sMLU %s on MLU %d belongs to no pod of this node: destroying it", instance.name, card)
        count += _remove(cndev, card, stale)
    return count
