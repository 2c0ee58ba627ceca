"""The node policies' one list: every name the configuration and the pod annotation accept has a policy module."""

from __future__ import annotations

from typing import get_args

from hami.model import SchedulingPolicy
from hami.scheduler import policy
from hami.scheduler.extender import ExtenderSettings
from hami.scheduler.policies import NODE_POLICIES, NodePolicy


def test_every_accepted_node_policy_name_has_its_module() -> None:
    accepted = set(get_args(SchedulingPolicy.model_fields["node"].annotation))
    assert accepted == set(NODE_POLICIES) == set(policy.NODE_POLICIES)
    for name in NODE_POLICIES:
        assert ExtenderSettings(node_policy=name).default_policy().node == name


def test_each_policy_is_named_for_its_key_and_orders_nodes() -> None:
    for name, implementation in NODE_POLICIES.items():
        assert isinstance(implementation, NodePolicy)
        assert implementation.name == name
        assert type(implementation).order is not NodePolicy.order, f"{name} does not order nodes"
