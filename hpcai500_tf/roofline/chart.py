"""The roofline chart (log-log): one roof per dtype, ridge points, layer points, the step."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLOURS = {
    "fp64": "tab:purple",
    "fp32": "tab:blue",
    "tf32": "tab:cyan",
    "bf16": "tab:orange",
    "fp16": "tab:red",
}


def draw(record: dict, out_stem: Path) -> list[Path]:
    """Write OUT_STEM.png and OUT_STEM.svg; returns their paths."""
    bandwidth = record["bandwidth_ceiling"]
    fig, ax = plt.subplots(figsize=(9, 6))
    for dtype, result in record["dtypes"].items():
        _draw_roof(ax, dtype, result, bandwidth)
    if record.get("workload"):
        _draw_workload(ax, record["workload"])
    run = record.get("run")
    if run:
        label = f"training run (record), per {run.get('per', 'device')}"
        ax.scatter(
            [run["operational_intensity"]], [run["achieved_flops"]], marker="D", s=80,
            color="lime", edgecolor="black", zorder=4, label=label,
        )  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("operational intensity (FLOPs per byte of memory traffic)")
    ax.set_ylabel("FLOPS")
    summary = record["layers"]["L1"].get("summary", "")
    bw = f", bandwidth {bandwidth / 1e9:.1f} GB/s" if bandwidth else ""
    ax.set_title(f"Roofline: {summary}{bw}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    paths = []
    for suffix in (".png", ".svg"):
        path = out_stem.with_suffix(suffix)
        fig.savefig(path, dpi=120, bbox_inches="tight")
        paths.append(path)
    plt.close(fig)
    return paths


def _draw_roof(ax, dtype: str, result: dict, bandwidth: float | None) -> None:
    """One dtype's roof (bandwidth slope, then its best compute ceiling) and ridge point; the
    lower of its GEMM and convolution ceilings dotted."""
    compute = max(v for v in (result["gemm_ceiling"], result["conv_ceiling"]) if v)
    colour = COLOURS.get(dtype, "black")
    if bandwidth:
        ridge = compute / bandwidth
        xs = [0.05, ridge, 1e4]
        ax.plot(
            xs, [min(compute, bandwidth * x) for x in xs], color=colour,
            label=f"{dtype} roof ({compute / 1e9:.0f} GFLOP/s)",
        )  # fmt: skip
        ax.plot([ridge], [compute], "o", color=colour)
        ax.annotate(
            f"ridge {ridge:.1f}", (ridge, compute), textcoords="offset points",
            xytext=(5, -12), fontsize=8, color=colour,
        )  # fmt: skip
    if result["gemm_ceiling"] and result["conv_ceiling"]:
        lower = min(result["gemm_ceiling"], result["conv_ceiling"])
        ax.axhline(lower, color=colour, linestyle=":", linewidth=0.8)


def _draw_workload(ax, work: dict) -> None:
    """The workload's layers, each timed alone, and its whole train step."""
    colour = COLOURS.get(work["dtype"], "black")
    xs = [p["operational_intensity"] for p in work["layers"]]
    ys = [p["achieved_flops"] for p in work["layers"]]
    ax.scatter(
        xs, ys, s=18, color=colour, edgecolor="black", linewidth=0.4, zorder=3,
        label=f"layers alone ({work['dtype']}, batch {work['batch']})",
    )  # fmt: skip
    step = work["step"]
    ax.scatter(
        [step["operational_intensity"]], [step["achieved_flops"]], marker="*", s=220,
        color="gold", edgecolor="black", zorder=4, label="whole train step",
    )  # fmt: skip
