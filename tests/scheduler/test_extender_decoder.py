"""The extender's body decoder (`hami.scheduler.server.parse`) on its own: any bytes give a model or a `BadBody`
that names what is wrong, never another exception; what it decodes is what the API serialised, and the Node
objects of the full-Nodes form are kept exactly as sent."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.scheduler.server import BadBody, BindingArgs, ExtenderArgs, parse

POD = {
    "metadata": {"name": "p", "namespace": "default", "uid": "u1", "labels": {"a": "b"}},
    "spec": {
        "schedulerName": "hami-scheduler",
        "priority": 1000,
        "preemptionPolicy": "PreemptLowerPriority",
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

NODE = {
    "metadata": {"name": "n", "labels": {"gpu": "on"}, "annotations": {"a": "b"}, "uid": "x", "finalizers": None},
    "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
    "status": {"capacity": {"cpu": 8, "nvidia.com/gpu": "4"}, "allocatable": {"cpu": "7500m"}, "images": []},
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


def node_lists() -> st.SearchStrategy[dict[str, Any]]:
    nodes = st.one_of(st.just(NODE), st.builds(lambda extra: {**NODE, "extra": extra}, json_values), json_values)
    return st.fixed_dictionaries(
        {"Pod": st.just(POD), "Nodes": st.dictionaries(st.sampled_from(["items", "Items"]), st.lists(nodes))}
    )


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    body=st.one_of(
        st.binary(max_size=200),
        json_values.map(lambda v: json.dumps(v).encode()),
        shaped(POD).map(lambda v: json.dumps(v).encode()),
        shaped(POD).map(lambda v: json.dumps(v).encode()[: len(json.dumps(v)) // 2]),
        node_lists().map(lambda v: json.dumps(v).encode()),
    ),
    model=st.sampled_from([ExtenderArgs, BindingArgs]),
)
def test_any_body_decodes_or_is_a_bad_body_with_a_message(body: bytes, model: type[Any]) -> None:
    error: BadBody | None = None
    try:
        args = parse(model, body)
    except BadBody as exc:
        error = exc
    assert error is None or str(error)
    if error is None and isinstance(args, ExtenderArgs):
        names, as_list = args.candidates()
        objects = args.node_objects()
        assert (objects is not None) == as_list
        if objects is not None:  # every Node the body passed with is readable, and is the one sent
            sent = json.loads(body)["Nodes"]
            assert list(objects) == (sent.get("items", sent.get("Items")) or [])
            assert [o["metadata"]["name"] for o in objects[:1]] == names[:1]


def test_a_pod_decodes_to_the_fields_the_extender_reads_as_the_api_serialises_them() -> None:
    args = parse(ExtenderArgs, json.dumps({"Pod": POD, "NodeNames": ["a", "b", "a"]}).encode())
    assert args.candidates() == (("a", "b"), False)
    assert args.node_objects() is None
    pod = args.pod.as_object()
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}
    assert container["env"] == [{"name": "X", "value": "1"}, {"name": "Y", "valueFrom": {"fieldRef": {}}}]
    assert "image" not in container
    assert "status" not in pod
    assert (pod["spec"]["priority"], pod["spec"]["preemptionPolicy"]) == (1000, "PreemptLowerPriority")
    listed = parse(ExtenderArgs, json.dumps({"pod": POD, "nodes": {"Items": [{"metadata": {"name": "n"}}]}}).encode())
    assert listed.candidates() == (["n"], True)


def test_the_same_node_names_array_is_read_once_and_a_different_one_read_again() -> None:
    """kube-scheduler sends the same NodeNames with every filter: the names are decoded, checked and de-duplicated
    once, and later filters get the very same tuple; any other array is read (and checked) again."""
    names = [f"node-{i}" for i in range(50)] + ["node-0"]
    first = parse(ExtenderArgs, json.dumps({"Pod": POD, "NodeNames": names}).encode()).candidates()[0]
    again = parse(ExtenderArgs, bytearray(json.dumps({"pod": POD, "NodeNames": names}).encode())).candidates()[0]
    assert first == tuple(names[:50])
    assert again is first
    other = parse(ExtenderArgs, json.dumps({"Pod": POD, "nodeNames": names[1:]}).encode()).candidates()[0]
    assert other == (*names[1:50], "node-0")
    with pytest.raises(BadBody, match=r"NodeNames\.50: Expected `str` matching"):
        parse(ExtenderArgs, json.dumps({"Pod": POD, "NodeNames": [*names[:50], "-bad"]}).encode())
    with pytest.raises(BadBody, match=r"nodenames: Expected `array \| null`, got `str`"):
        parse(ExtenderArgs, json.dumps({"Pod": POD, "nodenames": "node-0"}).encode())
    assert parse(ExtenderArgs, json.dumps({"Pod": POD, "NodeNames": None}).encode()).candidates() == ((), False)
    assert parse(ExtenderArgs, json.dumps({"Pod": POD, "NodeNames": names}).encode()).candidates()[0] == first


def test_the_nodes_of_the_full_form_are_kept_exactly_as_sent() -> None:
    """Fields the scheduler does not read, nulls and integer quantities included: an autoscaler's template node
    is fitted from the Node as sent, and an answer carries the chosen Node as given (as HAMi's does)."""
    second = {**NODE, "metadata": {**NODE["metadata"], "name": "m"}}
    body = bytearray(json.dumps({"Pod": POD, "Nodes": {"items": [NODE, second, NODE]}}).encode())  # as the front
    args = parse(ExtenderArgs, body)
    assert args.candidates() == (["n", "m"], True)
    objects = args.node_objects()
    assert objects is not None
    assert list(objects) == [NODE, second, NODE]
    assert objects[-1] == NODE


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"PodName": "p", "PodNamespace": "default", "PodUID": "u"}', "Node: Field required"),
        (b'{"podname": "p", "podnamespace": "default", "poduid": "", "node": "n"}', "poduid"),
        (b'{"PodName": "p\\n", "PodNamespace": "default", "PodUID": "u", "Node": "n"}', "PodName"),
        (b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": [{}, {}]}', "NodeNames.0: Expected `str`"),
        (b'{"Pod": {"metadata": {"name": "p"}}, "nodeNames": ["n", "-n"]}', "nodeNames.1: Expected `str` matching"),
        (b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["n", "\xffn"]}', "NodeNames: Invalid UTF-8"),
        (b'{"Pod": null}', "Pod"),
        (b'{"NodeNames": []}', "Pod: Field required"),
        (b'{"Pod": {"metadata": {"name": "p\\ud800"}}}', "surrogate"),
        (b'{"Pod": {"metadata": {"name": "p"}, "spec": {"priority": 2147483648}}}', "Pod.spec.priority"),
        (b'{"Pod": {"metadata": {"name": "p"}, "spec": {"preemptionPolicy": "Always"}}}', "Pod.spec.preemptionPolicy"),
        (
            b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"metadata": {"name": "n", "annotations": '
            b"[]}}]}}",
            "Nodes.items.0.metadata.annotations",
        ),
        (
            b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"Items": [{"metadata": {"name": "n"}, "status": '
            b'{"capacity": {"cpu": 1.5}}}]}}',
            "Nodes.Items.0.status.capacity[...]: Expected `int | str`, got `float`",
        ),
        (b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{}, {}]}}', "Nodes.items.0.metadata"),
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
    with pytest.raises(BadBody, match=re.escape(message)):
        parse(model, body)
