"""Filters first (`hami.scheduler.precedence`): watch handlers wait while a decision is in progress, boundedly."""

from __future__ import annotations

import threading

import pytest
from scheduler_harness import Harness, gpu_node, gpu_pod

from hami.scheduler import precedence
from hami.scheduler.precedence import Precedence


def _yield_in_thread(p: Precedence, longest: float | None = None) -> tuple[threading.Event, list[bool]]:
    done, waited = threading.Event(), []

    def run() -> None:
        waited.append(p.yield_to_decisions(longest))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, waited


def test_nothing_deciding_nothing_waits() -> None:
    assert Precedence().yield_to_decisions(longest=60) is False


def test_a_handler_waits_for_the_decision_in_progress_and_goes_on_when_it_ends() -> None:
    p = Precedence()
    with p:
        assert p.deciding
        done, waited = _yield_in_thread(p, longest=60)
        assert not done.wait(0.2)  # held back while the decision runs
    assert done.wait(10)
    assert waited == [True]
    assert not p.deciding


def test_a_decision_that_does_not_end_holds_a_handler_back_only_so_long() -> None:
    p = Precedence()
    with p:
        done, waited = _yield_in_thread(p, longest=0.05)
        assert done.wait(10)
        assert waited == [True]


def test_a_handler_that_just_waited_catches_up_without_waiting_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # decisions back to back must not hold a watch to one event per decision
    monkeypatch.setattr(precedence, "YIELD_SECONDS", 60.0)
    p, results = Precedence(), []
    with p:
        done = threading.Event()

        def run() -> None:
            results.append(p.yield_to_decisions(longest=0.05))  # the decision does not end: waits, bounded
            results.extend(p.yield_to_decisions(longest=60) for _ in range(3))  # at once: no wait within 60 s
            done.set()

        threading.Thread(target=run, daemon=True).start()
        assert done.wait(10)
    assert results == [True, False, False, False]


def test_a_handler_on_the_deciding_thread_does_not_wait_for_itself() -> None:
    p = Precedence()
    with p:
        assert p.yield_to_decisions(longest=60) is False
        with p:
            pass
        assert p.yield_to_decisions(longest=60) is False  # still deciding after a nested decision ended


def test_nested_decisions_hold_until_the_last_ends() -> None:
    p = Precedence()
    with p:
        with p:
            pass
        assert p.deciding
        done, _ = _yield_in_thread(p, longest=60)
        assert not done.wait(0.1)
    assert done.wait(10)


def test_a_node_event_during_a_decision_is_applied_after_it(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precedence, "YIELD_SECONDS", 60.0)
    harness.start()
    assert harness.service is not None
    state, gate = harness.service.state, harness.service.extender.precedence
    with gate:
        harness.add_node(gpu_node("node-late", gpus=1))
        threading.Event().wait(0.2)  # the watch delivered it meanwhile, and its handler waits
        assert "node-late" not in state.nodes
    harness.flush()
    assert "node-late" in state.nodes


class _Counting(Precedence):
    def __init__(self) -> None:
        super().__init__()
        self.entered = 0

    def __enter__(self) -> None:
        self.entered += 1
        super().__enter__()


def test_each_filter_decides_under_the_precedence(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a", gpus=2))
    harness.add_pod(gpu_pod("p1", gpu=1, mem=3000))
    harness.add_pod(gpu_pod("p2", gpu=1, mem=3000))
    harness.start()
    assert harness.service is not None
    counting = harness.service.extender.precedence = _Counting()
    assert harness.filter("p1")["NodeNames"] == ["node-a"]
    assert harness.filter("p2")["NodeNames"] == ["node-a"]
    assert counting.entered == 2
    assert not counting.deciding
