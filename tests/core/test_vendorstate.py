"""`hami.vendorstate.VendorSettings`: one runtime per settings object, made once, of the asked type."""

from __future__ import annotations

import threading

from pydantic import ConfigDict

from hami.vendorstate import VendorSettings


class Settings(VendorSettings):
    model_config = ConfigDict(frozen=True)
    path: str = ""


class Session:
    made = 0

    def __init__(self) -> None:
        Session.made += 1


def test_each_settings_object_keeps_its_own_runtime_made_once() -> None:
    a, b = Settings(path="x"), Settings(path="x")
    first = a.runtime_of(Session, Session)
    assert a.runtime_of(Session, Session) is first
    assert b.runtime_of(Session, Session) is not first


def test_concurrent_first_uses_make_one_runtime() -> None:
    settings = Settings()
    before = Session.made
    got: list[Session] = []
    threads = [threading.Thread(target=lambda: got.append(settings.runtime_of(Session, Session))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Session.made == before + 1
    assert all(g is got[0] for g in got)


def test_a_runtime_of_another_type_is_replaced() -> None:
    settings = Settings()
    settings.runtime_of(str, lambda: "old")
    assert isinstance(settings.runtime_of(Session, Session), Session)
