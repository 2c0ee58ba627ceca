"""Helm's hook Jobs run for real on a cluster without a controller manager or kubelet.

The end-to-end cluster has neither, so a Job Helm creates would never run and `helm install` would wait for it
until its timeout. `HookJobRunner` plays both for the Jobs of one namespace: each new Job's container command
runs here as a process, under the identity of the Job's ServiceAccount (so the chart's RBAC is what it gets), and
the Job's status is then set Complete or Failed as the job controller sets it, which is what Helm waits on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from control_plane import ControlPlane
from kube_rest import ApiError


@dataclass
class HookRun:
    """One Job run: its name, exit status, output, and what `observe` saw just before it started."""

    job: str
    returncode: int
    output: str
    observed: Any = None


@dataclass
class HookJobRunner:
    plane: ControlPlane
    namespace: str
    observe: Callable[[str], Any] | None = None
    """Called with the Job's name just before it runs; its answer is kept in the run (what existed then)."""
    runs: list[HookRun] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> HookJobRunner:
        self._thread = threading.Thread(target=self._loop, name=f"hook-jobs-{self.namespace}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def ran(self, prefix: str) -> list[HookRun]:
        return [r for r in self.runs if r.job.startswith(prefix)]

    def _loop(self) -> None:
        assert self.plane.admin is not None
        while not self._stop.wait(0.2):
            try:
                jobs = self.plane.admin.list("Job", self.namespace)["items"]
            except ApiError:
                continue
            for job in jobs:
                if job["metadata"]["uid"] not in self._seen and not job.get("status", {}).get("conditions"):
                    self._seen.add(job["metadata"]["uid"])
                    self._run(job)

    def _run(self, job: dict[str, Any]) -> None:
        assert self.plane.admin is not None
        name = job["metadata"]["name"]
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        argv = [*container.get("command", []), *container.get("args", [])]
        if argv[0] == "python":  # the image's interpreter is this environment's
            argv[0] = sys.executable
        identity = self.plane.service_account(self.namespace, pod["serviceAccountName"])
        env = {
            **os.environ,
            "KUBECONFIG": str(identity.kubeconfig),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        observed = self.observe(name) if self.observe else None
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
        self.runs.append(HookRun(name, done.returncode, done.stdout + done.stderr, observed))
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if done.returncode == 0:
            status = {
                "succeeded": 1,
                "conditions": [_condition("SuccessCriteriaMet", now), _condition("Complete", now)],
            }
            status["completionTime"] = now
        else:
            status = {"failed": 1, "conditions": [_condition("FailureTarget", now), _condition("Failed", now)]}
        self.plane.admin.merge_patch("Job", name, {"status": {"startTime": now, **status}}, self.namespace, "status")


def _condition(kind: str, now: str) -> dict[str, str]:
    return {"type": kind, "status": "True", "lastProbeTime": now, "lastTransitionTime": now}
