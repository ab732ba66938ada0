"""Extreme Weather Analytics: the input pipeline's two readers at reference resolution (768 x
1152 x 16, 56.6 MB a sample) in samples/s per core, and the train step against the pipeline.

Writes synthetic ExtremeWeather files (the reference size) into a temporary directory, then:
  - readers: for each core count of --cores (default: 1 and every core this process may use), a
    child process pinned to that many cores (os.sched_setaffinity, before TensorFlow starts)
    times the training pipeline alone (shuffle, read, check, normalise, channels last) with
    each reader, in alternating windows (h5py, pread, h5py, ...: both see the same machine
    load; each window on a fresh iterator, its first sample untimed). "h5py" is the pipeline
    as it was (h5py and NumPy inside tf.numpy_function), "pread" the one that replaced it
    (data/extreme_weather.py);
  - unless --readers-only, as before: at reference resolution (batch 1, the reference model)
    and at the smoke preset's, the pipeline alone against the engine's train step on a fixed
    batch of the same shape (target >= 1.5x), and the profiled training FLOPs per sample.
Prints lscpu's model name, samples/s (median of the windows), per core, pread / h5py, and the
cores per GPU the pread pipeline needs for each --gpu-samples-per-s (your GPU's training rate
at reference resolution; none is assumed): GPU samples/s / samples/s per core. --json PATH
writes the same figures.

    python benchmarks/ewa_throughput.py [--reference-samples 8] [--seconds 20] [--cores 1 2]
        [--readers-only] [--gpu-samples-per-s 25 100] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcai500_tf.cluster.machine import cpu_facts  # noqa: E402

READERS = ("h5py", "pread")  # before, after


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


# ------------------------------------------------------------------------ readers


def reader_child(data_dir: Path, seconds: float, windows: int) -> dict:
    """In a process already pinned to its cores: samples/s of each reader's pipeline."""
    import gc

    from hpcai500_tf.data import extreme_weather as ew

    files = sorted(data_dir.glob("*.h5"))
    counts = [ew.check_file(path)[0] for path in files]
    _, height, width = ew.check_file(files[0])
    stats = ew.normalization(files, data_dir)
    pipelines = {
        reader: ew.dataset(
            files, counts, stats, True, 0, (1, 0), 1, (height, width), read_with=reader
        ).repeat()
        for reader in READERS
    }
    rates: dict[str, list[float]] = {reader: [] for reader in READERS}
    for _ in range(windows):
        for reader in READERS:
            samples = iter(pipelines[reader])
            next(samples)  # the iterator's threads started and one sample through: untimed
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds / windows:
                next(samples)
                count += 1
            rates[reader].append(count / (time.perf_counter() - start))
            del samples  # stops its threads before the other reader's window
            gc.collect()
    return {reader: {"samples_per_s": statistics.median(r), "windows": r}
            for reader, r in rates.items()}  # fmt: skip


def measure_readers(data_dir: Path, cores: int, seconds: float, windows: int) -> dict:
    """reader_child in a child process pinned to the first `cores` usable cores."""
    allowed = sorted(os.sched_getaffinity(0))[:cores]
    code = (
        "import json, os, sys; from pathlib import Path\n"
        f"os.sched_setaffinity(0, {allowed!r})\n"
        f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
        "import ewa_throughput as b\n"
        f"print(json.dumps(b.reader_child(Path({str(data_dir)!r}), {seconds!r}, {windows!r})))\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    if result.returncode:
        sys.exit(f"reader measurement on {cores} core(s) failed:\n{result.stderr[-4000:]}")
    rates = json.loads(result.stdout.strip().splitlines()[-1])
    for rate in rates.values():
        rate["per_core"] = rate["samples_per_s"] / len(allowed)
    return {"cores": len(allowed), "cpus": allowed, **rates,
            "pread_over_h5py": rates["pread"]["samples_per_s"]
            / rates["h5py"]["samples_per_s"]}  # fmt: skip


# ------------------------------------------------------------------------ train step


def measure(preset: str, overrides: list[str], data_dir: Path, seconds: float) -> dict:
    from hpcai500_tf.config import prepare
    from hpcai500_tf.data import extreme_weather as ew
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
        lambda: float(engine.train_step((images, labels))), engine.global_batch, seconds
    )
    return {
        "image": list(workload.image_size),
        "batch": engine.global_batch,
        "reader": ew.reader(workload.train_files)[0],
        "pipeline": {"samples_per_s": pipe_rate, "windows": pipe_runs},
        "step": {"samples_per_s": step_rate, "windows": step_runs},
        "flops": flops["per_example_training"],
        "analytical_forward": flops["analytical_per_example_forward"],
    }


def train_step_results(scratch: Path, reference: Path, seconds: float) -> dict:
    from hpcai500_tf.data.extreme_weather import write_synthetic

    smoke = scratch / "smoke"
    for year in (1979, 1980):
        write_synthetic(smoke / f"climo_{year}.h5", 64, 64, 96, year)
    common = ["data.train_years=[1979]", "data.eval_years=[1980]"]
    return {
        "reference (768x1152, batch 1)": measure(
            "reference",
            [*common, "training.batch_per_replica=1", "training.strategy=default"],
            reference,
            seconds,
        ),
        "smoke (64x96)": measure("smoke", [*common, "data.source=hdf5"], smoke, seconds),
    }


# ------------------------------------------------------------------------ main


def windows_text(values: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference-samples", type=int, default=8, help="per year file")
    parser.add_argument("--seconds", type=float, default=20.0, help="per measurement")
    parser.add_argument("--windows", type=int, default=3, help="per reader measurement")
    parser.add_argument("--cores", type=int, nargs="+", help="default: 1 and all usable")
    parser.add_argument("--readers-only", action="store_true", help="skip the train step")
    parser.add_argument(
        "--gpu-samples-per-s", type=float, nargs="+", default=[25.0, 100.0],
        help="training samples/s of one GPU at 768x1152 to feed (your figure; none is assumed)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from hpcai500_tf.data.extreme_weather import write_synthetic

    usable = len(os.sched_getaffinity(0))
    core_counts = sorted({min(n, usable) for n in (args.cores or [1, usable]) if n > 0})
    results: dict = {
        "cpu": cpu_facts()["cpu_model"],
        "usable_cores": usable,
        "image": [768, 1152, 16],
        "samples_per_file": args.reference_samples,
        "seconds_per_measurement": args.seconds,
    }
    with tempfile.TemporaryDirectory() as scratch:
        reference = Path(scratch) / "reference"
        years = (1979,) if args.readers_only else (1979, 1980)
        for year in years:
            write_synthetic(reference / f"climo_{year}.h5", args.reference_samples, 768, 1152, year)
        readers_dir = Path(scratch) / "readers"  # the training year alone
        readers_dir.mkdir()
        (readers_dir / "climo_1979.h5").symlink_to(reference / "climo_1979.h5")
        results["readers"] = [
            measure_readers(readers_dir, n, args.seconds, args.windows) for n in core_counts
        ]
        if not args.readers_only:
            results["train_step"] = train_step_results(Path(scratch), reference, args.seconds)
    widest = results["readers"][-1]
    results["cores_per_gpu"] = {
        f"{rate:g}": rate / widest["pread"]["per_core"] for rate in args.gpu_samples_per_s
    }

    print(f"CPU: {results['cpu']} ({usable} usable cores)")
    print(f"input pipeline alone at 768x1152x16 (56.6 MB a sample, {args.reference_samples} "
          f"samples in the page cache), samples/s:")  # fmt: skip
    for r in results["readers"]:
        for reader, label in zip(READERS, ("before", "after"), strict=True):
            rate = r[reader]
            print(f"  {r['cores']} core(s) {reader:5s} ({label:6s}) {rate['samples_per_s']:8.2f}"
                  f"  per core {rate['per_core']:7.2f}  (windows: "
                  f"{windows_text(rate['windows'])})")  # fmt: skip
        print(f"  {r['cores']} core(s) pread / h5py     {r['pread_over_h5py']:8.2f}x")
    print(f"cores per GPU the pread pipeline needs ({widest['pread']['per_core']:.2f} samples/s "
          f"per core on {widest['cores']} core(s)):")  # fmt: skip
    for rate, needed in results["cores_per_gpu"].items():
        print(f"  a GPU training {rate} samples/s: {needed:.1f} cores "
              f"({math.ceil(needed)} whole cores)")  # fmt: skip
    for name, r in results.get("train_step", {}).items():
        pipe, step = r["pipeline"]["samples_per_s"], r["step"]["samples_per_s"]
        print(f"{name}: batch {r['batch']}, input {r['image'][0]}x{r['image'][1]}x16, "
              f"reader {r['reader']}")  # fmt: skip
        print(f"  pipeline alone       {pipe:9.2f} samples/s  (windows: "
              f"{windows_text(r['pipeline']['windows'])})")  # fmt: skip
        print(f"  train step           {step:9.2f} samples/s  (windows: "
              f"{windows_text(r['step']['windows'])})")  # fmt: skip
        print(f"  pipeline / step      {pipe / step:9.2f}x")
        print(f"  training FLOPs per sample (profiled) {r['flops'] / 1e9:.2f} GFLOPs; "
              f"forward (analytical) {r['analytical_forward'] / 1e9:.2f} GFLOPs")  # fmt: skip
    text = json.dumps(results, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print("JSON:", json.dumps(results))


if __name__ == "__main__":
    main()
