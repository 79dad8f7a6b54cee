"""Server-side charts of the keyshift page: matplotlib figures rendered to inline SVG text.

No pyplot (its global state is not for a server's threads) and nothing fetched at view time: each
function builds a `matplotlib.figure.Figure`, renders it with `svg.fonttype = none` (labels stay
text, so the page can be searched and the SVG stays small) and returns the `<svg>` element. A
function returns "" when it has nothing to draw.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone

from keyshift.ui.data import MEASURED_PREFIX, BatchLoad, segment_starts

WIDTH_IN = 10.0
"""Figure width, inches (at 100 px per inch in the page's CSS)."""
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def _svg(figure) -> str:
    """The figure as an `<svg ...>...</svg>` element (XML prolog and doctype removed)."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "keyshift"}):
        figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _figure(height_in: float, rows: int = 1, ratios: Sequence[float] | None = None):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(WIDTH_IN, height_in), layout="constrained")
    axes = figure.subplots(rows, 1, sharex=True, gridspec_kw={"height_ratios": list(ratios)} if ratios else None)
    return figure, ([axes] if rows == 1 else list(axes))


def _times(seconds: Sequence[float]) -> list[datetime]:
    return [datetime.fromtimestamp(s, tz=timezone.utc) for s in seconds]


MIN_SPAN_S = 600.0
"""A time axis spans at least this many seconds (one evaluation alone would otherwise span years)."""


def _time_axis(axes, seconds: Sequence[float]) -> None:
    """Date ticks in UTC (concise labels), at least `MIN_SPAN_S` wide around the points."""
    from matplotlib import dates

    low, high = min(seconds), max(seconds)
    if high - low < MIN_SPAN_S:
        middle = (low + high) / 2
        low, high = middle - MIN_SPAN_S / 2, middle + MIN_SPAN_S / 2
    margin = (high - low) * 0.03
    axes.set_xlim(*_times([low - margin, high + margin]))
    locator = dates.AutoDateLocator(tz=timezone.utc)
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator, tz=timezone.utc))


def slot_load_svg(batches: Sequence[BatchLoad]) -> str:
    """Per-slot load over time: events per slot per batch (heat map) under each batch's balance degree.

    Args:
        batches: the run's batches (`data.batch_loads`), in batch order; P may change at a switch
            (the heat map is as tall as the largest P, slots a batch did not have stay blank).

    Returns:
        The SVG, or "" when no batch has per-slot events.
    """
    batches = [b for b in batches if b.slot_events]
    if not batches:
        return ""
    import numpy as np

    slots = max(len(b.slot_events) for b in batches)
    grid = np.full((slots, len(batches)), np.nan)
    for column, batch in enumerate(batches):
        grid[: len(batch.slot_events), column] = batch.slot_events
    figure, (top, heat) = _figure(4.6, 2, (1, 2))
    x = np.arange(len(batches))
    top.plot(x, [b.balance_degree for b in batches], marker="o", markersize=3, color=COLORS[0], label="balance degree (min/max)")
    top.set_ylim(0, 1.05)
    top.set_ylabel("balance degree")
    top.grid(alpha=0.3)
    image = heat.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis", origin="lower",
                        extent=(-0.5, len(batches) - 0.5, -0.5, slots - 0.5))
    figure.colorbar(image, ax=heat, label="events in the batch", pad=0.01)
    heat.set_ylabel("slot")
    heat.set_xlabel("micro-batch (run-wide id)")
    ticks = x if len(batches) <= 20 else np.linspace(0, len(batches) - 1, 11).round().astype(int)
    heat.set_xticks(ticks, [str(batches[i].batch_id) for i in ticks])
    heat.set_yticks(range(slots) if slots <= 16 else range(0, slots, max(1, slots // 8)))
    starts = segment_starts(batches)
    for start in starts:
        column = batches.index(start)
        label = f"{start.strategy or '?'} e{start.epoch if start.epoch is not None else '?'}"
        for axes in (top, heat):
            if column > 0:
                axes.axvline(column - 0.5, color="#d62728", linestyle="--", linewidth=1.2)
        top.annotate(label, (column - 0.45, 0.06), fontsize=8, color="#d62728" if column > 0 else "#333", va="bottom")
    top.set_title("per-slot load: events per slot per micro-batch (dashed: a switch took effect)", fontsize=10, loc="left")
    return _svg(figure)


def task_seconds_svg(stages: Mapping[str, Sequence[tuple[int, tuple[float, ...]]]]) -> str:
    """Executor seconds per task per batch, one heat map per stage: the source's ingest tasks
    (each reading a range of Kafka partitions; the slots themselves with one task per Kafka
    partition) and the stateful stage's S stateful partitions (each holding P/S adjacent slots;
    the slots themselves when S = P).

    Args:
        stages: `data.task_seconds`: stage -> [(batch id, seconds per task)].

    Returns:
        The SVG, or "" when no stage was timed.
    """
    stages = {name: rows for name, rows in stages.items() if rows}
    if not stages:
        return ""
    import numpy as np

    figure, axes_list = _figure(1.9 * len(stages) + 0.6, len(stages))
    for axes, (stage, rows) in zip(axes_list, sorted(stages.items())):
        slots = max(len(seconds) for _, seconds in rows)
        grid = np.full((slots, len(rows)), np.nan)
        for column, (_, seconds) in enumerate(rows):
            grid[: len(seconds), column] = seconds
        image = axes.imshow(grid, aspect="auto", interpolation="nearest", cmap="magma", origin="lower",
                            extent=(-0.5, len(rows) - 0.5, -0.5, slots - 0.5))
        figure.colorbar(image, ax=axes, label="task seconds", pad=0.01)
        axes.set_ylabel(f"{stage}\n{'task' if stage == 'source' else 'partition'}")
        ticks = range(len(rows)) if len(rows) <= 20 else np.linspace(0, len(rows) - 1, 11).round().astype(int)
        axes.set_xticks(list(ticks), [str(rows[i][0]) for i in ticks])
    axes_list[0].set_title("task seconds per task per micro-batch (Spark's task times, recorded by the job)", fontsize=10, loc="left")
    axes_list[-1].set_xlabel("micro-batch (run-wide id)")
    return _svg(figure)


def strategy_balance_svg(series: Mapping[str, Sequence[tuple[float, float]]], in_force: str | None = None,
                         switches: Sequence[tuple[float, str]] = ()) -> str:
    """Balance degree of every strategy over time, as the balance monitor scored them.

    Args:
        series: `data.strategy_balance_series`: name -> [(epoch seconds, balance degree)].
        in_force: the strategy in force at the last evaluation (drawn thicker).
        switches: `data.switch_decisions`: [(epoch seconds, strategy chosen)], drawn as vertical lines.

    Returns:
        The SVG, or "" when there is no point.
    """
    series = {name: points for name, points in series.items() if points}
    if not series:
        return ""
    figure, (axes,) = _figure(3.2)
    strategies = sorted(n for n in series if not n.startswith(MEASURED_PREFIX))
    for index, name in enumerate(strategies):
        points = series[name]
        thick = name == in_force
        axes.plot(_times([p[0] for p in points]), [p[1] for p in points], marker="o", markersize=3, color=COLORS[index % len(COLORS)],
                  linewidth=2.6 if thick else 1.2, label=f"{name} (in force)" if thick else name)
    for style, name in (("--", MEASURED_PREFIX + "processed"), (":", MEASURED_PREFIX + "arrivals")):
        if name in series:
            points = series[name]
            axes.plot(_times([p[0] for p in points]), [p[1] for p in points], linestyle=style, color="black", linewidth=1.4,
                      marker="x", markersize=5, label=name)
    for at, strategy in switches:
        axes.axvline(_times([at])[0], color="#d62728", linestyle="--", linewidth=1)
        axes.annotate(f"switch to {strategy}", (_times([at])[0], 0.02), fontsize=8, color="#d62728", rotation=90, va="bottom")
    axes.set_ylim(0, 1.05)
    axes.set_ylabel("balance degree (min/max)")
    axes.set_xlabel("evaluation time (UTC)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    axes.set_title("balance degree of every strategy on the monitor's samples, and of the measured loads", fontsize=10, loc="left")
    _time_axis(axes, [p[0] for points in series.values() for p in points] + [at for at, _ in switches])
    return _svg(figure)


def lag_svg(points: Sequence[tuple[float, int]]) -> str:
    """Total consumer lag (records) at each monitor evaluation.

    Args:
        points: `data.lag_series`: [(epoch seconds, records behind)].

    Returns:
        The SVG, or "" when there is no point.
    """
    if not points:
        return ""
    figure, (axes,) = _figure(2.4)
    axes.plot(_times([p[0] for p in points]), [p[1] for p in points], marker="o", markersize=3, color=COLORS[3])
    axes.set_ylim(bottom=0)
    axes.set_ylabel("records behind")
    axes.set_xlabel("evaluation time (UTC)")
    axes.grid(alpha=0.3)
    from matplotlib.ticker import FuncFormatter

    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    axes.set_title("consumer lag of the job at each evaluation (broker end offsets minus the job's next offsets, summed over partitions)", fontsize=10, loc="left")
    _time_axis(axes, [p[0] for p in points])
    return _svg(figure)
