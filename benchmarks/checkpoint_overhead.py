"""Checkpoints every epoch (the old cadence) against checkpoints by wall time, on many short
epochs: time per epoch of the same `train` run both ways, and their ratio.

By default a full-size ResNet-50 (width 1, blocks 3-4-6-3: a ~190 MB checkpoint with its
momentum) on the tiny preset's random 16x16 data, 8 steps an epoch, 30 epochs: at 128-512
GPUs an ImageNet epoch is as short. "every epoch" sets checkpoint_every = 1 and
checkpoint_minutes = 0; "by wall time" sets checkpoint_every = 0 and checkpoint_minutes =
--minutes (default 10: only the end checkpoint in a run this short). Each run is its own
process; each round runs both, the first alternating from round to round.

    python benchmarks/checkpoint_overhead.py [--rounds 3] [--epochs 30] [--minutes 10]
        [--out DIR] [--set data.train_examples=512] [--set model.width=0.125]

Per epoch is the elapsed time at the last epoch's end over the epochs (what time to quality
pays: every checkpoint but the one after the last epoch); the whole timed run is reported as
well. Prints one JSON line, then one line for people.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from hpcai500_tf.cluster.machine import cpu_facts

MODES = {
    "every_epoch": lambda minutes: ["training.checkpoint_every=1", "training.checkpoint_minutes=0"],
    "by_wall_time": lambda minutes: [
        "training.checkpoint_every=0",
        f"training.checkpoint_minutes={minutes}",
    ],
}
DEFAULT_SETS = [
    "data.source=random",
    "data.train_examples=256",
    "model.width=1.0",
    "model.blocks=[3, 4, 6, 3]",
]


def measure(mode: str, minutes: float, epochs: int, sets: list[str], out: str) -> dict:
    """One `train` run of `mode` (in this process): seconds per epoch and its checkpoints."""
    from hpcai500_tf.config import prepare
    from hpcai500_tf.engine import run

    overrides = [*sets, f"training.epochs={epochs}", *MODES[mode](minutes)]
    setup = prepare("image_classification", "tiny", overrides)
    with tempfile.TemporaryDirectory(dir=out) as run_out:
        record, _ = run.run_benchmark(setup, None, run_out)  # no TensorBoard: none asked for
    if record["status"] != "completed":
        raise SystemExit(f"{mode}: the run ended {record['status']}: {record['warnings']}")
    written = record["artifacts"]["checkpoints_written"]
    run_s = sum(s["stop"] - s["start"] for s in record["timeline"]["segments"])
    return {
        "epoch_s": record["timeline"]["epochs"][-1]["elapsed_s"] / epochs,
        "run_s": run_s,
        "checkpoints": len(written),
        "write_s": statistics.median(c["write_s"] for c in written),
        "checkpoint_cadence": record["artifacts"]["checkpoint_cadence"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--minutes", type=float, default=10.0, help="the wall-time interval")
    parser.add_argument("--out", default=None, help="where the runs write (default: a temp dir)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="config overrides for both modes, after the defaults " + " ".join(DEFAULT_SETS),
    )
    parser.add_argument("--one", choices=tuple(MODES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sets = [*DEFAULT_SETS, *args.set]
    out = args.out or tempfile.gettempdir()
    if args.one:
        print(json.dumps(measure(args.one, args.minutes, args.epochs, sets, out)))
        return
    runs = {mode: [] for mode in MODES}
    for round_index in range(args.rounds):
        order = list(MODES) if round_index % 2 == 0 else list(reversed(MODES))
        for mode in order:  # alternated, so a drift within a round favours neither
            command = [sys.executable, __file__, "--one", mode, "--epochs", str(args.epochs),
                       "--minutes", str(args.minutes), "--out", out,
                       *(f"--set={s}" for s in args.set)]  # fmt: skip
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                raise SystemExit(f"{mode} failed:\n{result.stderr[-2000:]}")
            runs[mode].append(json.loads(result.stdout.strip().splitlines()[-1]))
    summary = {
        mode: {
            "epoch_s": statistics.median(r["epoch_s"] for r in results),
            "run_s": statistics.median(r["run_s"] for r in results),
            "checkpoints": results[0]["checkpoints"],
            "write_s": statistics.median(r["write_s"] for r in results),
            "checkpoint_cadence": results[0]["checkpoint_cadence"],
            "runs": results,
        }
        for mode, results in runs.items()
    }
    every, by_time = summary["every_epoch"], summary["by_wall_time"]
    ratios = [
        e["epoch_s"] / w["epoch_s"]
        for e, w in zip(runs["every_epoch"], runs["by_wall_time"], strict=True)
    ]
    result = {
        "benchmark": "checkpoint_overhead",
        "cpu": cpu_facts()["cpu_model"],
        "sets": sets,
        "epochs": args.epochs,
        "rounds": args.rounds,
        "minutes": args.minutes,
        "out": out,
        **summary,
        "epoch_ratio": every["epoch_s"] / by_time["epoch_s"],
        "epoch_ratio_per_round": ratios,
        "run_ratio": every["run_s"] / by_time["run_s"],
    }
    print(json.dumps(result))
    print(
        f"{result['cpu']}: every epoch {every['epoch_s']:.3f} s/epoch ({every['checkpoints']} "
        f"checkpoints, {every['write_s']:.3f} s each) vs by wall time ({args.minutes:g} min) "
        f"{by_time['epoch_s']:.3f} s/epoch ({by_time['checkpoints']} checkpoint(s)): "
        f"{result['epoch_ratio']:.3f}x per epoch (median of {args.rounds} rounds; per round "
        + " ".join(f"{r:.3f}" for r in ratios)
        + f"), whole run {result['run_ratio']:.3f}x"
    )


if __name__ == "__main__":
    main()
