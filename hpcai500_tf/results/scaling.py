"""Scaling of one benchmark over replica counts, from finished records.

The unit is the replica (L6 `replicas`: a GPU, or a CPU worker), not the worker: one process
may drive 8 GPUs (MirroredStrategy, or one Slurm task per node), and 16 single-GPU workers are
16 replicas. Records that do not say (an imported one) count their workers. Records are
grouped by benchmark and preset. Within a group, runs that keep the global batch fixed form a
strong-scaling series; runs that keep the batch per replica fixed form a weak-scaling series.
Each series is measured against its run with the fewest replicas (R0):

    speedup    = throughput(R) / throughput(R0)
    efficiency = speedup / (R / R0)

Runs are grouped only with runs of the same benchmark, preset, workload (L7) and problem (L9);
repeated runs at one replica count are combined by their median. Throughput is training
examples per second of training (evaluation and checkpoints left out). For strong scaling the
time-to-quality efficiency TTQ(R0) x R0 / (TTQ(R) x R) is given too (weak-scaling runs solve
a different optimisation problem per size, so their times to quality are not compared).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from hpcai500_tf.errors import UserError
from hpcai500_tf.record import training_throughput


@dataclass(frozen=True)
class Point:
    paths: list[str]
    replicas: int  # the unit of scaling
    workers: int
    global_batch: int
    batch_per_replica: int
    throughput: float  # examples per second of timed run
    time_to_quality_s: float | None
    reached_target: bool


@dataclass(frozen=True)
class Row:
    point: Point
    speedup: float
    efficiency: float
    ttq_efficiency: float | None


@dataclass(frozen=True)
class Series:
    kind: str  # "strong" | "weak"
    label: str  # benchmark / preset, and what is held fixed
    rows: list[Row]


def point(path: str, record: dict) -> Point:
    l6 = record["layers"]["L6"]
    workers, global_batch = l6.get("workers"), l6.get("global_batch")
    if not isinstance(workers, int) or not isinstance(global_batch, int) or workers < 1:
        raise UserError(f"{path}: the record gives no worker count and global batch (layers.L6)")
    replicas = l6.get("replicas")
    replicas = replicas if isinstance(replicas, int) and replicas >= 1 else workers
    throughput = training_throughput(record)
    if throughput is None:
        raise UserError(f"{path}: the run trained no full epoch: no throughput to scale")
    if not 0 < throughput < math.inf:
        raise UserError(f"{path}: its timeline gives a throughput of {throughput}: none to scale")
    quality = record["quality"]
    return Point(
        paths=[path],
        replicas=replicas,
        workers=workers,
        global_batch=global_batch,
        batch_per_replica=global_batch // replicas,
        throughput=throughput,
        time_to_quality_s=quality["time_to_quality_s"] if quality["reached_target"] else None,
        reached_target=quality["reached_target"],
    )


def _median_per_replica_count(points: list[Point]) -> list[Point]:
    combined = []
    for replicas in sorted({p.replicas for p in points}):
        runs = [p for p in points if p.replicas == replicas]
        reached = [p.time_to_quality_s for p in runs if p.time_to_quality_s is not None]
        combined.append(
            Point(
                paths=[path for p in runs for path in p.paths],
                replicas=replicas,
                workers=statistics.median_low(p.workers for p in runs),
                global_batch=runs[0].global_batch,
                batch_per_replica=runs[0].batch_per_replica,
                throughput=statistics.median(p.throughput for p in runs),
                time_to_quality_s=statistics.median(reached) if reached else None,
                reached_target=bool(reached),
            )
        )
    return combined


def _series(kind: str, label: str, points: list[Point]) -> Series:
    points = _median_per_replica_count(points)
    base = points[0]
    rows = []
    for p in points:
        speedup = p.throughput / base.throughput
        efficiency = speedup / (p.replicas / base.replicas)
        ttq = None
        if kind == "strong" and p.time_to_quality_s and base.time_to_quality_s:
            ttq = (base.time_to_quality_s * base.replicas) / (p.time_to_quality_s * p.replicas)
        rows.append(Row(p, speedup, efficiency, ttq))
    return Series(kind, label, rows)


def analyse(records: list[tuple[str, dict]]) -> list[Series]:
    """Strong- and weak-scaling series (each with at least two replica counts)."""
    groups: dict[str, list[Point]] = {}
    for path, record in records:
        layers = record["layers"]
        key = json.dumps([record["benchmark"], record["preset"], layers["L7"], layers["L9"]])
        groups.setdefault(key, []).append(point(path, record))
    series = []
    for key, points in groups.items():
        benchmark, preset, _, problem = json.loads(key)
        label = f"{benchmark} / {preset} ({problem.get('dataset')})"
        for kind, field in (("strong", "global_batch"), ("weak", "batch_per_replica")):
            by_value: dict[int, list[Point]] = {}
            for p in points:
                by_value.setdefault(getattr(p, field), []).append(p)
            for value, members in sorted(by_value.items()):
                if len({p.replicas for p in members}) >= 2:
                    fixed = "global batch" if kind == "strong" else "batch per replica"
                    series.append(_series(kind, f"{label}, {fixed} {value}", members))
    if not series:
        raise UserError(
            "no scaling series: give records of one benchmark and preset at two or more "
            "replica counts with the same global batch (strong) or batch per replica (weak)"
        )
    return series


def to_json(series: list[Series]) -> list[dict]:
    return [
        {
            "kind": s.kind,
            "label": s.label,
            "rows": [
                {**asdict(r.point), **{k: v for k, v in asdict(r).items() if k != "point"}}
                for r in s.rows
            ],
        }
        for s in series
    ]


def chart(series: list[Series], out_dir: Path) -> list[Path]:
    """Throughput and efficiency against replicas (log2 x), ideal lines dashed: PNG and SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for s in series:
        replicas = [r.point.replicas for r in s.rows]
        line = left.plot(replicas, [r.point.throughput for r in s.rows], "o-", label=s.label)[0]
        base = s.rows[0].point
        ideal = [base.throughput * r / base.replicas for r in replicas]
        left.plot(replicas, ideal, "--", color=line.get_color(), alpha=0.5)
        right.plot(
            replicas,
            [r.efficiency for r in s.rows],
            "o-",
            color=line.get_color(),
            label=f"{s.kind}: {s.label}",
        )
    left.set(
        xscale="log",
        yscale="log",
        xlabel="replicas",
        ylabel="examples/s",
        title="Throughput (dashed: ideal)",
    )
    counts = sorted({r.point.replicas for s in series for r in s.rows})
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xticks(counts, [str(c) for c in counts])
    right.axhline(1.0, color="grey", linestyle="--", alpha=0.5)
    right.set(xlabel="replicas", ylabel="efficiency", title="Scaling efficiency", ylim=(0, 1.2))
    right.legend(fontsize=7, loc="lower left")
    figure.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "scaling.png", out_dir / "scaling.svg"]
    for path in paths:
        figure.savefig(path, dpi=120)
    plt.close(figure)
    return paths
