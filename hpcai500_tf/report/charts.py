"""Charts of one run for its report page, as SVG text to inline in the HTML: no image files
beside the page and nothing fetched from the network.

Figures are made without pyplot (no global figure list to close, nothing shown) and written
with text as SVG text, not glyph paths: the files stay small and the browser can search and
select the labels. Labels from records and power sources are shown literally (a `$` never
starts mathematics). Long series are thinned to at most MAX_POINTS points per line: a chart
1000 pixels wide shows no more.
"""

from __future__ import annotations

import functools
import html
import io
import re

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, MaxNLocator

MAX_POINTS = 1500
STYLE = {
    "svg.fonttype": "none",
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 8,
}
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)
_GROUP_ID = re.compile(r'<g id="[^"]*"')  # figure_1, axes_1, ...: repeated in every chart


def _styled(draw):
    """Run a chart function under the report's matplotlib settings, leaving the caller's. A
    chart whose values matplotlib cannot place (a record's numbers near float's limits, which
    its checks allow) is a note in its place: a page never fails for one of its charts."""

    @functools.wraps(draw)
    def styled(*args, **kwargs):
        with matplotlib.rc_context(STYLE):
            try:
                return draw(*args, **kwargs)
            except (ValueError, OverflowError) as error:
                return (
                    '<p class="missing">chart not drawn: its values are beyond what a chart '
                    f"can place ({html.escape(str(error))})</p>"
                )

    return styled


def literal(text: str, limit: int = 60) -> str:
    """Text as matplotlib shows it unchanged: `$` escaped (no mathematics), no leading `_`
    (which hides a legend entry), at most `limit` characters."""
    text = str(text)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    text = text.replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def thin(points: list, limit: int = MAX_POINTS) -> list:
    """Every k-th point so that at most about `limit` remain, the last one always kept."""
    if len(points) <= limit:
        return list(points)
    stride = -(-len(points) // limit)
    picked = list(points[::stride])
    if (len(points) - 1) % stride:
        picked.append(points[-1])
    return picked


_CANVASES: dict[str, tuple[Figure, Axes]] = {}
ELAPSED = "elapsed time of the timed run (s)"
THROUGHPUT = "throughput (examples/s)"


def quality_label(metric: str) -> str:
    return f"quality: {literal(metric)} (fraction)"


def _axes(kind: str, xlabel: str, ylabel: str) -> tuple[Figure, Axes]:
    """The figure and axes of one kind of chart, emptied for a new chart. Each kind keeps its
    figure for the life of the process: making a figure, its axes and their ticks is about
    half the cost of a chart, and a report of many runs draws hundreds (not thread-safe)."""
    if kind not in _CANVASES:
        figure = Figure(figsize=(9, 3.2))
        figure.subplots_adjust(left=0.1, right=0.98, top=0.95, bottom=0.15)
        axes = figure.add_subplot()
        for axis in (axes.xaxis, axes.yaxis):
            axis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
        _CANVASES[kind] = figure, axes
    figure, axes = _CANVASES[kind]
    for artist in [*axes.lines, *axes.patches, *axes.collections, *axes.texts]:
        artist.remove()
    if axes.get_legend() is not None:
        axes.get_legend().remove()
    axes.set_prop_cycle(None)  # colours start again from the first
    axes.relim()
    axes.set_autoscale_on(True)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    return figure, axes


def to_svg(figure: Figure) -> str:
    """The figure as an `<svg>` element to inline in HTML: no XML prolog, no metadata, and
    no group ids (the same in every chart: one page would repeat them; nothing refers to
    them, unlike the clip-path and marker ids, which are unique). The root names its axes'
    labels (data-xlabel, data-ylabel), which a page's reader or test can check against the
    text drawn."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    axes = figure.axes[0]
    names = (
        f'<svg data-xlabel="{html.escape(axes.get_xlabel())}" '
        f'data-ylabel="{html.escape(axes.get_ylabel())}" '
    )
    text = text[text.index("<svg") :].replace("<svg ", names, 1)
    return _GROUP_ID.sub("<g", _METADATA.sub("", text))


@_styled
def quality_chart(
    curve: list[tuple[float, float]],
    target: float,
    metric: str,
    time_to_quality_s: float | None,
    first_crossing: tuple[float, float] | None,
) -> str:
    """Quality at each evaluation against elapsed seconds, the target as a line, the time to
    quality (the score's reading) and the first evaluation on target marked."""
    figure, axes = _axes("quality", ELAPSED, quality_label(metric))
    points = thin(curve)
    axes.plot(*zip(*points, strict=True), marker="o", markersize=3, label=literal(metric))
    axes.axhline(target, color="tab:red", linestyle="--", linewidth=1, label=f"target {target:g}")
    if time_to_quality_s is not None:
        axes.axvline(
            time_to_quality_s, color="tab:green", linestyle=":", linewidth=1.5,
            label=f"time to quality {time_to_quality_s:.4g} s (the score's reading)",
        )  # fmt: skip
    if first_crossing is not None:
        axes.plot(
            *first_crossing, marker="*", markersize=12, color="gold", markeredgecolor="black",
            linestyle="none", label=f"first on target, {first_crossing[0]:.4g} s",
        )  # fmt: skip
    axes.set_xlim(left=0)
    axes.legend(loc="lower right")
    return to_svg(figure)


@_styled
def epoch_throughput_chart(epochs: list[tuple[float, float]]) -> str:
    """Examples per second of each epoch's training, at the elapsed time the epoch ended."""
    figure, axes = _axes(
        "epochs", "elapsed time of the timed run at each epoch's end (s)", THROUGHPUT
    )
    axes.yaxis.set_major_formatter(EngFormatter(sep=""))  # 120k, not 120000: the label fits
    axes.plot(*zip(*thin(epochs), strict=True), marker="o", markersize=4, color="tab:blue")
    axes.set_xlim(left=0)
    axes.set_ylim(0, max(rate for _, rate in epochs) * 1.08 or 1.0)  # the top markers whole
    return to_svg(figure)


@_styled
def step_throughput_chart(steps: list[tuple[int, float]]) -> str:
    """Examples per second as the run logged them, against the global train step."""
    figure, axes = _axes("steps", "global train step (count)", THROUGHPUT)
    axes.yaxis.set_major_formatter(EngFormatter(sep=""))
    axes.plot(*zip(*thin(steps), strict=True), linewidth=1, color="tab:purple")
    axes.set_ylim(0, max(rate for _, rate in steps) * 1.08 or 1.0)
    return to_svg(figure)


@_styled
def power_chart(
    series: list[tuple[str, list[tuple[float, float]]]],
    spans: list[tuple[float, float]],
    xlabel: str,
) -> str:
    """Watts of each source over time; the timed run's segments shaded."""
    figure, axes = _axes("power", xlabel, "power (W)")
    for index, (start, stop) in enumerate(spans):
        label = "timed run" if index == 0 else None
        axes.axvspan(start, stop, color="tab:green", alpha=0.08, linewidth=0, label=label)
    for label, points in series:
        axes.plot(*zip(*thin(points), strict=True), linewidth=1, label=literal(label))
    highest = max(watts for _, points in series for _, watts in points)
    axes.set_ylim(0, highest * 1.35 or 1.0)  # headroom: the legend sits above the lines
    axes.legend(loc="upper right", ncol=min(4, len(series) + 1))
    return to_svg(figure)


# ----------------------------------------------------------------------------- ranking charts

VALID_FLOPS = "Valid FLOPS (FLOP/s)"
COLOURS = matplotlib.colormaps["tab10"].colors


def _fresh(xlabel: str, ylabel: str, height: float = 4.2) -> tuple[Figure, Axes]:
    """A new figure (log axes and category ticks do not reset cleanly on a kept one); the
    ranking charts are a few per page."""
    figure = Figure(figsize=(9, height))
    figure.subplots_adjust(left=0.1, right=0.98, top=0.95, bottom=0.13)
    axes = figure.add_subplot()
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    return figure, axes


def colour_of(models: list[str]) -> dict[str, tuple]:
    """One colour per accelerator model, in the order given (tab10, then again)."""
    return {model: COLOURS[index % len(COLOURS)] for index, model in enumerate(models)}


@_styled
def scaling_chart(points: list[tuple[int, float, str, bool]]) -> str:
    """Valid FLOPS against accelerator count on log-log axes, one point per submission
    (count, Valid FLOPS, accelerator model, a published 2020 entry), coloured by model, the
    2020 entries as stars; per model a dashed line of ideal linear scaling through its
    smallest system (the best of that count)."""
    figure, axes = _fresh("accelerators (count, log scale)", VALID_FLOPS + ", log scale")
    axes.set_xscale("log")
    axes.set_yscale("log")
    models = sorted({model for _, _, model, _ in points})
    colours = colour_of(models)
    for model in models:
        mine = [(c, v, old) for c, v, m, old in points if m == model]
        for old, marker in ((False, "o"), (True, "*")):
            shown = [(c, v) for c, v, o in mine if o == old]
            if shown:
                axes.plot(*zip(*shown, strict=True), linestyle="none", marker=marker,
                          markersize=11 if old else 6, color=colours[model],
                          markeredgecolor="black" if old else colours[model],
                          label=literal(model, 40) + (" (2020)" if old else ""))  # fmt: skip
        smallest = min(c for c, _, _ in mine)
        base = max(v for c, v, _ in mine if c == smallest)
        largest = max(c for c, _, _ in mine)
        if largest > smallest:
            axes.plot([smallest, largest], [base, base * largest / smallest], linestyle="--",
                      linewidth=1, color=colours[model])  # fmt: skip
    axes.plot([], [], linestyle="--", color="grey", linewidth=1, label="ideal linear scaling")
    axes.legend(loc="upper left", fontsize=7, ncol=2 if len(models) > 4 else 1)
    return to_svg(figure)


@_styled
def per_accelerator_chart(points: list[tuple[str, float, bool]]) -> str:
    """Valid FLOPS per accelerator of each submission (model, value, a 2020 entry), one row
    of dots per accelerator model, the 2020 entries as stars."""
    models = sorted({model for model, _, _ in points})
    figure, axes = _fresh(
        "Valid FLOPS per accelerator (FLOP/s per accelerator)",
        "accelerator model (name)",
        height=max(2.6, 1.2 + 0.45 * len(models)),
    )
    figure.subplots_adjust(left=0.3, bottom=0.6 / figure.get_figheight())
    colours = colour_of(models)
    row = {model: index for index, model in enumerate(models)}
    for model, value, old in points:
        axes.plot(value, row[model], linestyle="none", marker="*" if old else "o",
                  markersize=11 if old else 6, color=colours[model],
                  markeredgecolor="black" if old else colours[model], alpha=0.8)  # fmt: skip
    axes.set_yticks(range(len(models)), [literal(m, 40) for m in models])
    axes.set_ylim(-0.6, len(models) - 0.4)
    axes.xaxis.set_major_formatter(EngFormatter(sep=""))
    axes.set_xlim(left=0)
    return to_svg(figure)


@_styled
def rank_chart(points: list[tuple[int, int, str]]) -> str:
    """The HPC AI500 rank (by Valid FLOPS) against MLPerf's time-to-train rank of the same
    systems (MLPerf rank, HPC AI500 rank, label); where they agree a point sits on the
    diagonal, and the systems furthest off it are named."""
    figure, axes = _fresh(
        "MLPerf rank by time to train (position, 1 = fastest)",
        "HPC AI500 rank by Valid FLOPS (position, 1 = highest)",
    )
    count = max(max(a, b) for a, b, _ in points)
    axes.plot([1, count], [1, count], color="grey", linestyle="--", linewidth=1,
              label="same rank in both")  # fmt: skip
    agree = [(a, b) for a, b, _ in points if a == b]
    differ = [(a, b) for a, b, _ in points if a != b]
    if agree:
        axes.plot(*zip(*agree, strict=True), "o", color="tab:blue", markersize=5,
                  label="same rank")  # fmt: skip
    if differ:
        axes.plot(*zip(*differ, strict=True), "o", color="tab:red", markersize=6,
                  label="ranks differ")  # fmt: skip
    furthest = sorted(points, key=lambda p: -abs(p[0] - p[1]))[:6]
    for a, b, label in furthest:
        if a != b:
            axes.annotate(literal(label, 30), (a, b), textcoords="offset points",
                          xytext=(5, 3), fontsize=7)  # fmt: skip
    axes.set_xlim(0.5, count + 0.5)
    axes.set_ylim(count + 0.5, 0.5)  # 1 at the top
    axes.legend(loc="upper right")
    return to_svg(figure)


@_styled
def runs_chart(
    runs: list[tuple[str, list[tuple[float, float]], bool]], target: float, metric: str
) -> str:
    """The quality curve of each run of a submission on one chart (label, curve, counted by
    the mean); the target as a line; runs left out dashed."""
    figure, axes = _axes("runs", ELAPSED, quality_label(metric))
    for label, curve, counted in runs:
        axes.plot(*zip(*thin(curve), strict=True), marker="o", markersize=2.5,
                  linewidth=1.4 if counted else 1, linestyle="-" if counted else "--",
                  label=literal(label, 50))  # fmt: skip
    axes.axhline(target, color="tab:red", linestyle=":", linewidth=1, label=f"target {target:g}")
    axes.set_xlim(left=0)
    axes.legend(loc="lower right", fontsize=7, ncol=2 if len(runs) > 5 else 1)
    return to_svg(figure)
