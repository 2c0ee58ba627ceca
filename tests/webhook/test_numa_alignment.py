"""`hami.io/numa-alignment` at admission: HAMi's two values (any case, surrounding whitespace) are admitted; any
other value is denied with a 403 that says what to write, as HAMi denies it (controller-runtime's Denied), and never
answered with a 5xx."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from webhook_kit import Webhook, container, gpu, pod, review, vendor_plugins

from hami.numaalign import NUMA_ALIGNMENT_ANNOTATION as ALIGN
from hami.numaalign import NumaAlignmentError, parse_numa_alignment
from hami.webhook.server import WebhookApp


@pytest.mark.parametrize("value", ["strict", "best-effort", " Strict\n", "BEST-EFFORT"])
def test_hamis_values_are_admitted_as_written(webhook: Webhook, value: str) -> None:
    result = webhook.admit(pod(container("c0", gpu(2, 1000)), annotations={ALIGN: value}))
    assert result.allowed, result.message
    assert result.pod["metadata"]["annotations"][ALIGN] == value  # left as written: the scheduler reads it so


@pytest.mark.parametrize(
    ("value", "hint"),
    [("strickt", ' (did you mean "strict"?)'), ("besteffort", ' (did you mean "best-effort"?)'), ("", ""), ("1", "")],
)
def test_another_value_is_denied_with_what_to_write(webhook: Webhook, value: str, hint: str) -> None:
    result = webhook.admit(pod(container("c0", gpu(2, 1000)), annotations={ALIGN: value}))
    assert not result.allowed
    assert result.code == 403
    assert f'hami.io/numa-alignment is {value!r}{hint}: write "best-effort"' in result.message
    assert 'or "strict" (devices of one NUMA node, or no placement), or remove the annotation' in result.message


def test_a_pod_without_devices_is_denied_too_as_hami_denies_it(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("c0", {}), annotations={ALIGN: "yes"}))
    assert not result.allowed
    assert result.code == 403


def test_a_pod_for_another_scheduler_is_left_alone_whatever_it_says(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("c0", gpu()), annotations={ALIGN: "yes"}, scheduler="volcano"))
    assert result.allowed


APP = WebhookApp(vendor_plugins())
NEAR = st.text(alphabet=st.sampled_from(list("strictbefoSTRICTBEFO-\u0130 \t\n\x85\xa0\u2000\u3000\x1c")), max_size=14)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.text(max_size=30) | NEAR)
def test_fuzz_any_value_is_admitted_or_denied_with_a_403(value: str) -> None:
    body = review(pod(container("c0", gpu(2, 1000)), annotations={ALIGN: value}))
    status, answer = APP.handle("POST", "/mutate", json.dumps(body).encode())
    assert status == 200
    response: dict[str, Any] = answer["response"]
    try:
        parse_numa_alignment(value)  # its own rule is fuzzed against Go's in tests/core/test_numaalign.py
    except NumaAlignmentError:
        assert not response["allowed"], value
        assert response["status"]["code"] == 403, response
        assert "hami.io/numa-alignment is" in response["status"]["message"]
    else:
        assert response["allowed"], response
