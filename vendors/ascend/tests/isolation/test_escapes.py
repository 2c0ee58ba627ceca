"""The linker's doors the core closes, tried by a process of the container (hami.testing.isolation.LookupTests)."""

from __future__ import annotations

from hami.testing.isolation import LookupTests


class TestLookups(LookupTests):
    driver_library = "libascendcl.so"
