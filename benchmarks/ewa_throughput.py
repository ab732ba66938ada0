"""Extreme Weather Analytics: train-step samples/s against the HDF5 input pipeline alone, at
the reference resolution (768 x 1152, batch 1, the reference model) and at the smoke preset's,
and the profiled training FLOPs per sample at reference resolution.

Writes synthetic ExtremeWeather files of each size into a temporary directory (the reference
size is 56.6 MB a sample), then for each preset in one process:
  - the input pipeline (HDF5 read sample by sample, normalise, batch) alone;
  - the engine's train step on a fixed batch of the same shape.
Reports samples/s of both (medians over timed windows) and pipeline / train step (target
>= 1.5x).

    python benchmarks/ewa_throughput.py [--reference-samples 8] [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timed_rate(step, per_call: int, seconds: float, windows: int = 3) -> tuple[float, list]:
    """Median samples/s over `windows` windows of at least `seconds / windows` each."""
    step()  # warm-up
    rates = []
    for _ in range(windows):
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / windows:
            step()
            calls += 1
        rates.append(calls * per_call / (time.perf_counter() - start))
    return statistics.median(rates), rates


def measure(preset: str, overrides: list[str], data_dir: Path, seconds: float) -> dict:
    from hpcai500_tf.config import prepare
    from hpcai500_tf.engine.run import build_engine, measure_flops

    setup = prepare("extreme_weather", preset, overrides)
    engine = build_engine(setup, str(data_dir))
    workload = engine.workload
    pipeline = workload.dataset(True, 0, (1, 0)).repeat()
    pipeline = pipeline.batch(engine.global_batch, drop_remainder=True).prefetch(2)
    batches = iter(pipeline)
    pipe_rate, pipe_runs = timed_rate(lambda: next(batches), engine.global_batch, seconds)
    images, labels = next(batches)
    batch = engine.synthetic_batch()
    flops = measure_flops(engine, batch)
    step_rate, step_runs = timed_rate(
        lambda: float(engine.train_step(images, labels)), engine.global_batch, seconds
    )
    return {
        "image": workload.image_size,
        "batch": engine.global_batch,
        "pipeline": (pipe_rate, pipe_runs),
        "step": (step_rate, step_runs),
        "flops": flops["per_example_training"],
        "analytical_forward": flops["analytical_per_example_forward"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference-samples", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from hpcai500_tf.data.extreme_weather import write_synthetic

    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        reference = Path(scratch) / "reference"
        smoke = Path(scratch) / "smoke"
        for year in (1979, 1980):
            write_synthetic(reference / f"climo_{year}.h5", args.reference_samples, 768, 1152, year)
            write_synthetic(smoke / f"climo_{year}.h5", 64, 64, 96, year)
        common = ["data.train_years=[1979]", "data.eval_years=[1980]"]
        results["reference (768x1152, batch 1)"] = measure(
            "reference",
            [*common, "training.batch_per_replica=1", "training.strategy=default"],
            reference,
            args.seconds,
        )
        results["smoke (64x96)"] = measure(
            "smoke", [*common, "data.source=hdf5"], smoke, args.seconds
        )
    for name, r in results.items():
        pipe, step = r["pipeline"][0], r["step"][0]
        print(f"{name}: batch {r['batch']}, input {r['image'][0]}x{r['image'][1]}x16")
        print(f"  HDF5 pipeline alone  {pipe:9.2f} samples/s  (windows: "
              f"{', '.join(f'{x:.2f}' for x in r['pipeline'][1])})")  # fmt: skip
        print(f"  train step           {step:9.2f} samples/s  (windows: "
              f"{', '.join(f'{x:.2f}' for x in r['step'][1])})")  # fmt: skip
        print(f"  pipeline / step      {pipe / step:9.2f}x")
        print(f"  training FLOPs per sample (profiled) {r['flops'] / 1e9:.2f} GFLOPs; "
              f"forward (analytical) {r['analytical_forward'] / 1e9:.2f} GFLOPs")  # fmt: skip


if __name__ == "__main__":
    main()
