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
import io
import re

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

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
    """Run a chart function under the report's matplotlib settings, leaving the caller's."""

    @functools.wraps(draw)
    def styled(*args, **kwargs):
        with matplotlib.rc_context(STYLE):
            return draw(*args, **kwargs)

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


def _axes(kind: str, xlabel: str, ylabel: str) -> tuple[Figure, Axes]:
    """The figure and axes of one kind of chart, emptied for a new chart. Each kind keeps its
    figure for the life of the process: making a figure, its axes and their ticks is about
    half the cost of a chart, and a report of many runs draws hundreds (not thread-safe)."""
    if kind not in _CANVASES:
        figure = Figure(figsize=(9, 3.2))
        figure.subplots_adjust(left=0.08, right=0.98, top=0.95, bottom=0.15)
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
    them, unlike the clip-path and marker ids, which are unique)."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return _GROUP_ID.sub("<g", _METADATA.sub("", text[text.index("<svg") :]))


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
    figure, axes = _axes(
        "quality", "elapsed seconds of the timed run", f"quality ({literal(metric)})"
    )
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
        "epochs", "elapsed seconds of the timed run (end of each epoch)", "examples/s"
    )
    axes.plot(*zip(*thin(epochs), strict=True), marker="o", markersize=4, color="tab:blue")
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    return to_svg(figure)


@_styled
def step_throughput_chart(steps: list[tuple[int, float]]) -> str:
    """Examples per second as the run logged them, against the global train step."""
    figure, axes = _axes("steps", "global train step", "examples/s")
    axes.plot(*zip(*thin(steps), strict=True), linewidth=1, color="tab:purple")
    axes.set_ylim(bottom=0)
    return to_svg(figure)


@_styled
def power_chart(
    series: list[tuple[str, list[tuple[float, float]]]],
    spans: list[tuple[float, float]],
    xlabel: str,
) -> str:
    """Watts of each source over time; the timed run's segments shaded."""
    figure, axes = _axes("power", xlabel, "watts")
    for index, (start, stop) in enumerate(spans):
        label = "timed run" if index == 0 else None
        axes.axvspan(start, stop, color="tab:green", alpha=0.08, linewidth=0, label=label)
    for label, points in series:
        axes.plot(*zip(*thin(points), strict=True), linewidth=1, label=literal(label))
    highest = max(watts for _, points in series for _, watts in points)
    axes.set_ylim(0, highest * 1.35 or 1.0)  # headroom: the legend sits above the lines
    axes.legend(loc="upper right", ncol=min(4, len(series) + 1))
    return to_svg(figure)
