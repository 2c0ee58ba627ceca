"""History from Prometheus, when a URL is configured: the scheduler's allocation families over the last hours.

Owns the four range queries (`/api/v1/query_range`) over the families `hami scheduler` exports
(`hami_gpu_memory_allocated_bytes`, `hami_gpu_memory_limit_bytes`, `hami_gpu_core_allocated_ratio`,
`hami_gpu_core_limit_ratio`, summed over the cluster) and turning their answers into the same `Sample`s as the
in-process ring buffer, so the chart draws either. A Prometheus that does not answer, or answers an error, gives
the reason instead; the page then falls back to the ring buffer and says why.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from hami.dashboard.source import Sample

__all__ = ["QUERIES", "prometheus_history"]

MIB = 1024 * 1024
QUERIES = {
    "memory_used": f"sum(hami_gpu_memory_allocated_bytes) / {MIB}",
    "memory_total": f"sum(hami_gpu_memory_limit_bytes) / {MIB}",
    "cores_used": "sum(hami_gpu_core_allocated_ratio) * 100",
    "cores_total": "sum(hami_gpu_core_limit_ratio) * 100",
}
TIMEOUT_SECONDS = 3.0


def _range(base: str, query: str, start: float, end: float, step: float) -> dict[float, float]:
    params = urllib.parse.urlencode({"query": query, "start": f"{start:.0f}", "end": f"{end:.0f}", "step": f"{step:g}"})
    with urllib.request.urlopen(f"{base.rstrip('/')}/api/v1/query_range?{params}", timeout=TIMEOUT_SECONDS) as answer:
        body: Any = json.loads(answer.read(16 * 1024 * 1024))
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else None
        raise ValueError(f"Prometheus answered {error or 'something that is not a query result'}")
    result = (body.get("data") or {}).get("result") or []
    if not result:
        return {}
    return {float(t): float(v) for t, v in result[0].get("values") or ()}


def prometheus_history(
    base: str, *, hours: float = 6.0, points: int = 240, now: float | None = None
) -> tuple[list[Sample], str]:
    """Samples over the last `hours` (about `points` of them), and "" or why there are none."""
    end = now if now is not None else time.time()
    start = end - hours * 3600
    step = max(15.0, hours * 3600 / points)
    try:
        series = {name: _range(base, query, start, end, step) for name, query in QUERIES.items()}
    except urllib.error.HTTPError as exc:
        return [], f"Prometheus at {base} answered HTTP {exc.code}"
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return [], f"Prometheus at {base} did not answer usefully: {reason}"
    stamps = sorted(set.intersection(*(set(s) for s in series.values()))) if all(series.values()) else []
    samples = [
        Sample(
            at=t,
            memory_used=int(series["memory_used"][t]),
            memory_total=int(series["memory_total"][t]),
            cores_used=int(series["cores_used"][t]),
            cores_total=int(series["cores_total"][t]),
            pods=0,
            pending=0,
        )
        for t in stamps
    ]
    return samples, "" if samples else f"Prometheus at {base} has no samples of the scheduler's metrics yet"
