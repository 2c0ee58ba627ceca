"""The dashboard's charts, as inline SVG made on the server: a device's shares as a stacked bar, history as lines.

Owns the geometry only (which pod gets which stretch of a bar, the points of a line); the markup around it is
the templates'. Every chart carries a text alternative (`aria-label`, `<title>`), and the figures it draws are
also printed beside it, so nothing is only in a picture. Colours come from a palette in the CSS (`.s0`…`.s7`)
chosen for contrast on the page's background.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

from hami.dashboard.source import Sample
from hami.status import DeviceStatus

__all__ = ["Line", "Segment", "bar_segments", "history_chart", "line_chart", "meter"]

PALETTE = 8


@dataclass(frozen=True)
class Segment:
    label: str
    start: float
    width: float
    css: str


def meter(used: int, total: int, unit: str, label: str) -> Markup:
    """A used-of-total bar with its figures beside it (red from 90 %). Made here rather than in a template macro:
    the cluster page draws one per node, and at 1,000 nodes a macro call each cost a third of the page."""
    pct = 100 * used // total if total else 0
    high = " high" if pct >= 90 else ""
    text = escape(label)
    return Markup(
        f'<div class="meter" role="img" aria-label="{text}: {used} of {total} {escape(unit)} ({pct}%)">'
        f'<span class="fill{high}" style="width: {pct}%"></span></div>'
        f'<span class="figure">{used} / {total} {escape(unit)} <span class="pct">{pct}%</span></span>'
    )


def bar_segments(device: DeviceStatus) -> list[Segment]:
    """The device's memory as a bar: one segment per pod (in percent of the device), in the order listed."""
    total = device.memory_total or 1
    at = 0.0
    segments = []
    for n, pod in enumerate(device.pods):
        width = min(100.0 - at, 100.0 * pod.memory / total)
        segments.append(Segment(f"{pod.namespace}/{pod.name}: {pod.memory} MiB", at, width, f"s{n % PALETTE}"))
        at += width
    return segments


def history_chart(samples: Sequence[Sample], *, width: int = 600, height: int = 120) -> Markup:
    """Memory and cores allocated (percent of total) over the samples, as an SVG line chart."""
    if len(samples) < 2:
        return Markup('<p class="note">History appears after two samples (one every interval).</p>')
    first, last = samples[0].at, samples[-1].at
    span = max(last - first, 1.0)

    def points(values: Sequence[float]) -> str:
        return " ".join(
            f"{width * (s.at - first) / span:.1f},{height - height * min(v, 100.0) / 100:.1f}"
            for s, v in zip(samples, values, strict=True)
        )

    memory = [100.0 * s.memory_used / s.memory_total if s.memory_total else 0.0 for s in samples]
    cores = [100.0 * s.cores_used / s.cores_total if s.cores_total else 0.0 for s in samples]
    minutes = span / 60
    label = (
        f"Allocated over the last {minutes:.0f} minutes: memory from {memory[0]:.0f}% to {memory[-1]:.0f}%, "
        f"cores from {cores[0]:.0f}% to {cores[-1]:.0f}%"
    )
    return Markup(
        f'<svg class="history" viewBox="0 0 {width} {height}" preserveAspectRatio="none" role="img" '
        f'aria-label="{escape(label)}"><title>{escape(label)}</title>'
        f'<line class="grid" x1="0" y1="{height / 2}" x2="{width}" y2="{height / 2}"/>'
        f'<polyline class="line-memory" points="{points(memory)}"/>'
        f'<polyline class="line-cores" points="{points(cores)}"/></svg>'
    )


@dataclass(frozen=True)
class Line:
    """One series of a line chart: its CSS class, its name (for the text alternative), (time, percent or None)."""

    css: str
    name: str
    points: Sequence[tuple[float, float | None]]
    unit: str = "%"
    per_percent: float = 1.0
    """Units per percent of the chart's height (10 for watts drawn on a 0-1000 W scale)."""


def line_chart(lines: Sequence[Line], what: str, *, width: int = 600, height: int = 120) -> Markup:
    """Percent (0-100) series over time as an SVG line chart, one polyline per run of known values (an unknown
    figure is a gap, not a drop to zero); `what` names the chart in its text alternative."""
    stamps = [t for line in lines for t, v in line.points if v is not None]
    if len(stamps) < 2 or max(stamps) == min(stamps):
        return Markup(f'<p class="note">{escape(what)}: the trend appears after two samples.</p>')
    first, span = min(stamps), max(stamps) - min(stamps)
    parts, told = [], []
    for line in lines:
        runs: list[list[str]] = [[]]
        known = [v for _, v in line.points if v is not None]
        for t, v in line.points:
            if v is None:
                runs.append([])
                continue
            y = min(max(v / line.per_percent, 0.0), 100.0)
            runs[-1].append(f"{width * (t - first) / span:.1f},{height - height * y / 100:.1f}")
        for run in runs:
            if len(run) == 1:
                cx, cy = run[0].split(",")
                parts.append(f'<circle class="{line.css}" cx="{cx}" cy="{cy}" r="2"/>')
            elif run:
                parts.append(f'<polyline class="{line.css}" points="{" ".join(run)}"/>')
        if known:
            told.append(f"{line.name} from {known[0]:.0f}{line.unit} to {known[-1]:.0f}{line.unit}")
        else:
            told.append(f"{line.name} unknown")
    spoken = f"{span:.0f} s" if span < 120 else f"{span / 60:.0f} min" if span < 7200 else f"{span / 3600:.1f} h"
    label = f"{what} over the last {spoken}: " + ", ".join(told)
    return Markup(
        f'<svg class="history" viewBox="0 0 {width} {height}" preserveAspectRatio="none" role="img" '
        f'aria-label="{escape(label)}"><title>{escape(label)}</title>'
        f'<line class="grid" x1="0" y1="{height / 2}" x2="{width}" y2="{height / 2}"/>{"".join(parts)}</svg>'
    )
