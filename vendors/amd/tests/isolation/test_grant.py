"""Limits from the node's grant, which no process of the container can lift (hami.testing.isolation.GrantTests)."""

from __future__ import annotations

from hami.testing.isolation import GrantTests


class TestGrant(GrantTests):
    policy_variable = "HIP_CORE_UTILIZATION_POLICY"
    out_of_memory = 2  # hipErrorOutOfMemory
