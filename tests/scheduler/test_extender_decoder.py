"""The extender's body decoder (`hami.scheduler.server.parse`) on its own: any bytes give a model or a `BadBody`
that names what is wrong, never another exception; what it decodes is what the API serialised."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.scheduler.server import BadBody, BindingArgs, ExtenderArgs, parse

POD = {
    "metadata": {"name": "p", "namespace": "default", "uid": "u1", "labels": {"a": "b"}},
    "spec": {
        "schedulerName": "hami-scheduler",
        "containers": [
            {
                "name": "c",
                "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "1000"}},
                "env": [{"name": "X", "value": "1"}, {"name": "Y", "valueFrom": {"fieldRef": {}}}],
                "securityContext": {"privileged": False},
                "image": "skipped",
            }
        ],
    },
    "status": {"phase": "Pending"},
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)


def shaped(value: Any) -> st.SearchStrategy[dict[str, Any]]:
    """Bodies shaped like the verbs' bodies, any part of them replaced by any JSON value."""
    keys = ["Pod", "pod", "Nodes", "NodeNames", "nodeNames", "PodName", "PodNamespace", "PodUID", "Node"]
    return st.dictionaries(st.sampled_from(keys), st.one_of(st.just(value), json_values), max_size=6)


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    body=st.one_of(
        st.binary(max_size=200),
        json_values.map(lambda v: json.dumps(v).encode()),
        shaped(POD).map(lambda v: json.dumps(v).encode()),
        shaped(POD).map(lambda v: json.dumps(v).encode()[: len(json.dumps(v)) // 2]),
    ),
    model=st.sampled_from([ExtenderArgs, BindingArgs]),
)
def test_any_body_decodes_or_is_a_bad_body_with_a_message(body: bytes, model: type[Any]) -> None:
    error: BadBody | None = None
    try:
        parse(model, body)
    except BadBody as exc:
        error = exc
    assert error is None or str(error)


def test_a_pod_decodes_to_the_fields_the_extender_reads_as_the_api_serialises_them() -> None:
    args = parse(ExtenderArgs, json.dumps({"Pod": POD, "NodeNames": ["a", "b", "a"]}).encode())
    assert args.candidates() == (["a", "b"], False)
    container = args.pod.as_object()["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}
    assert container["env"] == [{"name": "X", "value": "1"}, {"name": "Y", "valueFrom": {"fieldRef": {}}}]
    assert "image" not in container
    assert "status" not in args.pod.as_object()
    listed = parse(ExtenderArgs, json.dumps({"pod": POD, "nodes": {"Items": [{"metadata": {"name": "n"}}]}}).encode())
    assert listed.candidates() == (["n"], True)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"PodName": "p", "PodNamespace": "default", "PodUID": "u"}', "Node: Field required"),
        (b'{"podname": "p", "podnamespace": "default", "poduid": "", "node": "n"}', "poduid"),
        (b'{"PodName": "p\\n", "PodNamespace": "default", "PodUID": "u", "Node": "n"}', "PodName"),
        (b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": [{}, {}]}', "NodeNames.0: Expected `str`"),
        (b'{"Pod": null}', "Pod"),
        (b'{"Pod": {"metadata": {"name": "p\\ud800"}}}', "surrogate"),
        (b"[" * 100_000, "the body: Expected `object`, got `array`"),
        (
            b'{"Pod":{"metadata":{"name":"p"},"spec":{"containers":[{"env":[{"name":"x","valueFrom":{"a":'
            + b"[" * 100_000,
            "nested too deeply",
        ),
    ],
)
def test_a_bad_body_names_the_field(body: bytes, message: str) -> None:
    model = BindingArgs if b"odName" in body or b"odname" in body else ExtenderArgs
    with pytest.raises(BadBody, match=message.replace("[", r"\[")):
        parse(model, body)
