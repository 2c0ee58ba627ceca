"""Presenting simulations: the table at the end of a run, the JSON line for scripts, and the plot.

Owns the output formats only. The JSON line is `{"policies": {"<name>": {"unallocated_pct": {"<arrived %>":
value, ...}, "alloc_ratio": {...}, "failed": {...}, "fragmentation_pct": x, "placed": n, "pods": n,
"seconds": s}}, "seconds": s}`. Plots need matplotlib (`pip install hami-core[plot]`); without it `--plot`
says so instead of failing late.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from hami.errors import ConfigError
from hami.simulate.engine import SimulationResult

__all__ = ["Progress", "as_json", "plot", "table"]

MARKS = (50, 80, 90, 95, 100, 110, 120, 130)


def as_json(results: Sequence[SimulationResult], seconds: float) -> dict[str, Any]:
    return {
        "policies": {
            r.policy: {
                "unallocated_pct": {str(k): v for k, v in r.unallocated_pct.items()},
                "alloc_ratio": {str(k): v for k, v in r.alloc_ratio.items()},
                "failed": dict(r.failed.most_common()),
                "fragmentation_pct": r.fragmentation_pct,
                "placed": r.placed,
                "pods": r.pods,
                "seconds": r.seconds,
            }
            for r in results
        },
        "seconds": round(seconds, 2),
    }


def table(results: Sequence[SimulationResult]) -> str:
    """Unallocated GPU % at the usual arrived-workload marks, one row per policy, then failures."""
    marks = [m for m in MARKS if any(m in r.alloc_ratio for r in results)]
    width = max([len("policy"), *(len(r.policy) for r in results)])
    lines = [
        "unallocated GPU % by arrived workload (% of capacity)",
        f"{'policy':<{width}}  " + "  ".join(f"{m:>6}%" for m in marks) + "   frag %   seconds",
    ]
    for r in results:
        cells = "  ".join(f"{r.unallocated_pct[m]:>7.2f}" if m in r.alloc_ratio else f"{'-':>7}" for m in marks)
        lines.append(f"{r.policy:<{width}}  {cells}  {r.fragmentation_pct:>7.2f}  {r.seconds:>8.1f}")
    for r in results:
        if r.failed:
            top = ", ".join(f"{n} × {why}" for why, n in r.failed.most_common(3))
            lines.append(f"{r.policy}: {r.pods - r.placed} of {r.pods} pods not placed; most often: {top}")
    return "\n".join(lines)


def plot(results: Sequence[SimulationResult], path: str | Path) -> None:
    """A PNG of unallocated GPU % against arrived workload, one line per policy."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'hami-core[plot]'") from None
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=120)
    for r in results:
        points = sorted((k, v) for k, v in r.unallocated_pct.items() if k >= 5)
        axes.plot([k for k, _ in points], [v for _, v in points], marker="o", markersize=3, label=r.policy)
    axes.set_xlabel("arrived workload (% of GPU capacity)")
    axes.set_ylabel("unallocated GPU (%)")
    axes.set_title("GPU left unallocated as the workload arrives")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


class Progress:
    """A one-line progress bar on a terminal (nothing when the stream is not one)."""

    def __init__(self, label: str, stream: TextIO = sys.stderr) -> None:
        self.label = label
        self.stream = stream
        self.enabled = stream.isatty()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        filled = int(30 * done / total) if total else 30
        self.stream.write(f"\r{self.label:<22} [{'#' * filled}{'.' * (30 - filled)}] {done}/{total}")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def dump(payload: dict[str, Any], stream: TextIO = sys.stdout) -> None:
    stream.write(json.dumps(payload) + "\n")
