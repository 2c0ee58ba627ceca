"""How the extender decides and binds: the `scheduler` section of the configuration (`ExtenderSettings`).

Read by the filter (`hami.scheduler.extender`), candidate ordering (`hami.scheduler.candidates`) and bind
(`hami.scheduler.binding`); built by `hami.scheduler.run` from the configuration file. Holds values only.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from hami.model import SchedulingPolicy

__all__ = ["ExtenderSettings"]


class ExtenderSettings(BaseModel):
    """How the extender decides; the `scheduler` section of the configuration."""

    model_config = ConfigDict(extra="forbid")

    node_policy: str = Field(default="binpack", pattern="^(binpack|spread|best-fit|fragmentation-aware|usage)$")
    device_policy: tuple[str, ...] | None = Field(
        default=None, description="None: spread under binpack/spread, the node policy's own device choice otherwise"
    )
    batch_size: int = Field(default=16, ge=1, description="nodes fitted per vendor call before stopping early")
    lock_expiry_seconds: float = Field(default=300, gt=0)
    bind_lock_wait_seconds: float = Field(default=5, ge=0)
    handshake_interval_seconds: float = Field(
        default=30, ge=0, description="seconds between handshake rounds with the node daemons; 0 disables them"
    )
    dra_driver: str | None = Field(
        default=None, description="the DRA driver whose allocated ResourceClaims count as usage (hami.scheduler.claims)"
    )
    pass_over_nodes_in_flight: bool = Field(
        default=False,
        description="read a node whose earlier decision still awaits its Allocate after every other candidate, "
        "fewest waiting first (`hami scheduler` does): its bind would wait for that node lock, so consecutive pods "
        "of a burst spread over nodes that can bind at once; False: the policy's order alone (the simulator, which "
        "never allocates)",
    )
    record_at_bind: bool = Field(
        default=False,
        description="write each decision's annotations with the bind, on the Binding itself after the node lock "
        "(`hami scheduler` does): no API call on the filter's path, and the pod written once, with its node; False: "
        "before the filter answers",
    )

    preemption_enabled: bool = Field(
        default=False,
        description="preempt lower-priority pods, by device, for a pod no node fits (hami.scheduler.preempting)",
    )
    preemption_dry_run: bool = Field(
        default=False, description="with preemption on: only record (an Event, a log line) what would be evicted"
    )
    preemption_hold_seconds: float = Field(
        default=120, gt=0, description="how long the room a preemption frees is held for its preemptor"
    )

    def default_policy(self) -> SchedulingPolicy:
        device = self.device_policy
        if device is None:
            device = ("spread",) if self.node_policy in ("binpack", "spread") else (self.node_policy,)
        return SchedulingPolicy(node=self.node_policy, device=device)
