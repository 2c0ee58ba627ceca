"""Start-up: hundreds of processes of one container starting together all initialize with their limits on
(hami.testing.isolation's check; each child: aclrtSetDevice, its slot, one byte over the limit refused, one byte
allocated)."""

from __future__ import annotations

from hami.testing.isolation import StartupTests


class TestStartup(StartupTests):
    pass
