"""Presenting simulations: the table at the end of a run, the JSON line for scripts, and the plot.

Owns the output formats only. The JSON line is `{"policies": {"<name>": {"unallocated_pct": {"<arrived %>":
value, ...}, "alloc_ratio": {...}, "failed": {...}, "fragmentation_pct": x, "placed": n, "pods": n,
"seconds": s[, "contention": {"latency_pods": n, "contended_pct": x, "neighbour_busy_mean": x}]}}, "seconds": s}`
(contention with a usage trace, `hami.simulate.usage`). Plots need matplotlib (the `plot` extra of hami-core);
`check_plot_path` refuses an unwritable `--plot` before the run starts, so a mistake never costs a run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from hami.errors import ConfigError
from hami.simulate.engine import SimulationResult

__all__ = ["Progress", "as_json", "check_plot_path", "plot", "table"]

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
                **(
                    {
                        "contention": {
                            "latency_pods": r.contention.latency_pods,
                            "contended_pct": r.contention.contended_pct,
                            "neighbour_busy_mean": r.contention.neighbour_busy_mean,
                            "contended_on_arrival_pct": r.contention.contended_on_arrival_pct,
                            "neighbour_busy_on_arrival": r.contention.neighbour_busy_on_arrival,
                        }
                    }
                    if r.contention is not None
                    else {}
                ),
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
        if r.contention is not None:
            c = r.contention
            lines.append(
                f"{r.policy}: of {c.latency_pods} latency-sensitive shares, beside a saturating neighbour (others' "
                f"work >= 50% of the device) on arrival {c.contended_on_arrival_pct:.2f}%, at the end "
                f"{c.contended_pct:.2f}%; others' busy share on their device on arrival "
                f"{c.neighbour_busy_on_arrival:.1f}%, at the end {c.neighbour_busy_mean:.1f}%"
            )
    for r in results:
        if r.failed:
            top = ", ".join(f"{n} × {why}" for why, n in r.failed.most_common(3))
            lines.append(f"{r.policy}: {r.pods - r.placed} of {r.pods} pods not placed; most often: {top}")
    return "\n".join(lines)


def check_plot_path(path: str | Path) -> Path:
    """Refuse a `--plot` that could not be written, before a minutes-long run rather than after it."""
    target = Path(path)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--plot needs matplotlib: install it into this environment (pip install matplotlib, or from a checkout "
            "pip install -e './core[plot]')"
        ) from None
    if target.suffix.lower() != ".png":
        raise ConfigError(f"--plot {path}: the plot is a PNG; give a file name ending in .png")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"--plot {path}: the folder {parent} does not exist")
    if target.is_dir():
        raise ConfigError(f"--plot {path}: is a folder; give a file name ending in .png")
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ConfigError(f"--plot {path}: not writable by this user")
    return target


def plot(results: Sequence[SimulationResult], path: str | Path) -> None:
    """A PNG of unallocated GPU % against arrived workload, one line per policy."""
    check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    """A one-line progress bar with the time left, on a terminal (nothing when the stream is not one).

    The estimate is the elapsed time scaled by the share of pods still to place; placements get slower as the
    cluster fills, so it errs low early on and settles within a few seconds.
    """

    def __init__(self, label: str, stream: TextIO = sys.stderr, clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.stream = stream
        self.clock = clock
        self.enabled = stream.isatty()
        self.started: float | None = None

    def line(self, done: int, total: int) -> str:
        """The bar as it is drawn: label, bar, counts, elapsed and the estimated time left."""
        now = self.clock()
        if self.started is None:
            self.started = now
        elapsed = now - self.started
        filled = int(30 * done / total) if total else 30
        if done >= total:
            left = f"done in {elapsed:.0f} s"
        elif done:
            left = f"{elapsed:.0f} s, about {elapsed * (total - done) / done:.0f} s left"
        else:
            left = "starting"
        return f"{self.label:<22} [{'#' * filled}{'.' * (30 - filled)}] {done}/{total}  {left}"

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        self.stream.write(f"\r{self.line(done, total)}\x1b[K")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def dump(payload: dict[str, Any], stream: TextIO = sys.stdout) -> None:
    stream.write(json.dumps(payload) + "\n")
