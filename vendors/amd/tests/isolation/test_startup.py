"""Start-up: hundreds of processes of one container starting together all initialize with their limits on
(hami.testing.isolation's check)."""

from __future__ import annotations

from hami.testing.isolation import StartupTests


class TestStartup(StartupTests):
    pass
