"""Per-container device usage for the node monitor, read from the isolation libraries' accounting files.

Owns turning the accounting files of the containers this node served (their host paths come from the vendors'
container edits, `ContainerEdits.accounting_file`) into `ContainerUsage` records: memory in use and the limit the
library enforces per device, the share of device time the container used since the previous scrape, and the time
since its last launch. A file that does not exist yet (no process has started) or cannot be read gives no record,
so the monitor shows zero for that container rather than failing the scrape.

The file's layout is `hami.isolation`'s (LAYOUT.md); this module only maps it onto the served containers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from hami.isolation.accounting import AccountingFileError, read_accounting
from hami.node.monitor import ContainerUsage
from hami.node.pods import ServedContainer

__all__ = ["AccountingReader"]

log = logging.getLogger(__name__)


class AccountingReader:
    """A `ContainerUsageReader` over the accounting files of the served containers.

    Utilization is the device time charged to the container between two scrapes over the wall time between
    them; the first scrape of a container reports zero.
    """

    def __init__(
        self, served: Callable[[], Iterable[ServedContainer]], clock: Callable[[], int] = time.time_ns
    ) -> None:
        self.served = served
        self.clock = clock
        self._lock = threading.Lock()
        self._previous: dict[tuple[str, int], tuple[int, int]] = {}
        """(file, device index) → (device time charged, wall clock) at the previous scrape."""

    def __call__(self) -> list[ContainerUsage]:
        records: list[ContainerUsage] = []
        seen: set[tuple[str, int]] = set()
        now = self.clock()
        for container in self.served():
            path = container.accounting_file
            if not path:
                continue
            try:
                account = read_accounting(path)
            except FileNotFoundError:
                continue
            except (OSError, AccountingFileError) as exc:
                log.warning("accounting file of %s/%s %s unreadable: %s", container.namespace, container.pod,
                            container.container, exc)  # fmt: skip
                continue
            for index, placed in enumerate(container.devices):
                try:
                    device = account.device(index)
                except KeyError:
                    continue
                key = (path, index)
                seen.add(key)
                with self._lock:
                    before = self._previous.get(key)
                    self._previous[key] = (device.device_time_ns, now)
                utilization = 0.0
                if before is not None and now > before[1]:
                    utilization = max(0, device.device_time_ns - before[0]) / (now - before[1])
                last = (now - device.last_kernel_ns) / 1e9 if device.last_kernel_ns else 0.0
                records.append(
                    ContainerUsage(
                        pod_uid=container.pod_uid,
                        container=container.container,
                        device_uuid=placed.uuid,
                        memory_used_bytes=device.memory_used,
                        utilization_ratio=utilization,
                        last_kernel_elapsed_seconds=max(0.0, last),
                        memory_limit_bytes=device.memory_limit or None,
                    )
                )
        with self._lock:
            for key in set(self._previous) - seen:
                del self._previous[key]
        return records
