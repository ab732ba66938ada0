"""`hpcai500-tf report` over many runs: the time to write a page per run and the ranking page
for `--runs` copies of one finished run, in one process after a warm-up report of one run
(imports, fonts and TensorBoard's reader loaded), against the target (`--target-s`).

The copies vary what a ranking varies: each has its own time (every elapsed time, epoch and
segment scaled), its own quality (the curve scaled and re-read with the record's own rule)
and its own system name (L1). Each keeps the run's power samples and TensorBoard events, so
every page has every chart. The run copied is `--run RUN_DIR`, or a tiny image-classification
run trained first (under a minute on 2 cores; not timed). A run without power samples (no
power source where it ran) gets synthetic ones: a counter and a power source at 10 Hz.

    python benchmarks/report_pages.py [--runs 100] [--run RUN_DIR] [--target-s 30]
"""

from __future__ import annotations

import argparse
import copy
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcai500_tf import record as record_io  # noqa: E402
from hpcai500_tf.cluster.machine import cpu_facts  # noqa: E402
from hpcai500_tf.report import pages  # noqa: E402


def train_tiny(out: Path) -> Path:
    """A finished run of the tiny image-classification preset; its run directory."""
    command = [sys.executable, "-m", "hpcai500_tf.cli", "train", "image_classification"]
    command += ["--preset", "tiny", "--out", str(out)]
    trained = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if trained.returncode != 0:
        sys.exit(f"training the tiny run failed:\n{trained.stderr[-2000:]}")
    (record_path,) = out.glob("*/record.json")
    return record_path.parent


def varied(record: dict, index: int) -> dict:
    """The record with its times scaled, its quality scaled and its own system name."""
    record = copy.deepcopy(record)
    time_scale = 0.5 + (index * 37 % 100) / 100
    quality_scale = 0.9 + (index * 53 % 100) / 1000
    timeline = record["timeline"]
    for segment in timeline["segments"]:
        segment["stop"] = segment["start"] + (segment["stop"] - segment["start"]) * time_scale
    if timeline["segments"]:
        timeline["run_stop"] = max(timeline["run_stop"], timeline["segments"][-1]["stop"])
    for epoch in timeline["epochs"]:
        epoch["elapsed_s"] *= time_scale
        epoch["seconds"] = epoch.get("seconds", 0.0) * time_scale
    quality = record["quality"]
    for point in quality["curve"]:
        point["elapsed_s"] *= time_scale
        point["value"] = min(1.0, point["value"] * quality_scale)
    quality.update(
        record_io.quality_result(quality["curve"], quality["target"], quality["measured"])
    )
    examples = quality["examples_to_quality"]
    flops = record["flops"]
    flops["total"] = None if examples is None else flops["per_example_training"] * examples
    record["layers"]["L1"]["summary"] = f"benchmark system {index % 25:02d}"
    return record_io.validate(record)


def synthetic_power_samples(record: dict, path: Path, hz: float = 10.0) -> None:
    """A CPU-package energy counter and a GPU power source at `hz` over the run's timed
    segments, for a run made where no power source could be read."""
    lines = ["worker,source,unix_s,value,unit"]
    start, stop = record["timeline"]["run_start"], record["timeline"]["run_stop"]
    for index in range(int((stop - start) * hz) + 2):
        stamp = start + index / hz
        lines.append(f"0,rapl:package-0,{stamp:.4f},{95.0 * index / hz:.6f},J")
        lines.append(f"0,gpu0,{stamp:.4f},{180 + 40 * (index % 20 < 10):.6f},W")
    path.write_text("\n".join(lines) + "\n")


def make_runs(source: Path, count: int, into: Path) -> list[Path]:
    record = record_io.load(source / "record.json")
    if not (source / "power-samples.csv").exists():
        synthetic_power_samples(record, into / "power-samples.csv")
    runs = []
    for index in range(count):
        run_dir = into / f"run-{index:03d}"
        run_dir.mkdir()
        record_io.save(run_dir / "record.json", varied(record, index))
        for name in ("power-samples.csv", "tensorboard"):
            origin = source / name if (source / name).exists() else into / name
            if origin.is_file():
                shutil.copy2(origin, run_dir / name)
            elif origin.is_dir():
                shutil.copytree(origin, run_dir / name)
        runs.append(run_dir)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--run", type=Path, help="a finished run directory to copy")
    parser.add_argument("--target-s", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="report-pages-") as scratch:
        scratch = Path(scratch)
        source = args.run or train_tiny(scratch / "trained")
        (scratch / "copies").mkdir()
        runs = make_runs(source, args.runs, scratch / "copies")
        present = [n for n in ("power-samples.csv", "tensorboard") if (runs[0] / n).exists()]
        if not (source / "power-samples.csv").exists():
            present[0] += " (synthetic: the run had none)"
        start = time.perf_counter()
        pages.write_report([str(runs[0])], scratch / "warm-up")
        warm_up = time.perf_counter() - start
        start = time.perf_counter()
        written = pages.write_report([str(run) for run in runs], scratch / "report")
        seconds = time.perf_counter() - start
        size = sum(page.stat().st_size for page in written)
    verdict = "within" if seconds < args.target_s else "OVER"
    print(f"copied run: {source} (with {', '.join(present) or 'no power samples or events'})")
    print(f"warm-up (one run, first in the process): {warm_up:.2f} s")
    print(
        f"report over {args.runs} runs: {seconds:.2f} s ({seconds / args.runs * 1000:.0f} ms a "
        f"run; {len(written)} pages, {size / 1e6:.1f} MB), {verdict} the {args.target_s:g} s "
        f"target, on {cpu_facts()['cpu_model']}"
    )
    return 0 if seconds < args.target_s else 1


if __name__ == "__main__":
    sys.exit(main())
