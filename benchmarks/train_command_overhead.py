"""The full `train` command (live view, TensorBoard scalars, MLPerf log, loss checks, a
checkpoint every epoch) against a bare loop over the same engine's train step, on the same data
and steps (`--no-tensorboard`: the command without TensorBoard).

Random data keeps evaluation out of both (a throughput-only run evaluates nothing), so the
difference is the command's own cost. Each measurement runs in its own process; each round
runs both kinds, the first alternating from round to round. Reports the median examples/s of
each, full/bare of those medians, and the median of the per-round full/bare ratios (a round's
two runs are neighbours in time, so that ratio is the one least moved by drift on a shared
machine).

    python benchmarks/train_command_overhead.py [--preset smoke] [--epochs 3] [--rounds 3]
        [--set data.train_examples=16384] [--no-tensorboard] [--framework pytorch]

`--framework pytorch` measures the PyTorch side the same way: the full `train --framework
pytorch` (the same lifecycle) against a bare loop over its trainer's step, in processes that
never load TensorFlow (their data come from the feeder process).

A checkpoint costs ~0.03-0.1 s here (written by a traced function), so on the smoke
preset's 4-second epochs it shows as about one percent; longer epochs amortise it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def overrides(epochs: int, extra: list[str]) -> list[str]:
    return [
        "data.source=random",
        f"training.epochs={epochs}",
        "training.checkpoint_every=1",
        *extra,
    ]


def measure_full(
    preset: str, epochs: int, extra: list[str], tensorboard: bool = True, framework="tensorflow"
) -> float:
    from hpcai500_tf.config import prepare
    from hpcai500_tf.report.live import LiveView
    from hpcai500_tf.report.tensorboard import TensorBoard
    from hpcai500_tf.run.options import RunOptions

    if framework == "pytorch":
        from hpcai500_tf.pytorch.train import run
    else:
        from hpcai500_tf.engine.run import run
    setup = prepare("image_classification", preset, overrides(epochs, extra))
    view = LiveView()
    with tempfile.TemporaryDirectory() as out:
        try:
            board = TensorBoard() if tensorboard else None
            record, _ = run(setup, RunOptions(out_dir=out), [view, board])
        finally:
            view.close()
    seconds = sum(s["stop"] - s["start"] for s in record["timeline"]["segments"])
    return record["timeline"]["epochs"][-1]["examples"] / seconds


def measure_bare(preset: str, epochs: int, extra: list[str], framework="tensorflow") -> float:
    from hpcai500_tf.config import prepare
    from hpcai500_tf.run.options import RunOptions

    setup = prepare("image_classification", preset, overrides(epochs, extra))
    if framework == "pytorch":
        from hpcai500_tf.pytorch.train import TorchTrainer

        trainer = TorchTrainer(setup, RunOptions())
    else:
        from hpcai500_tf.engine.run import build_trainer

        trainer = build_trainer(setup, RunOptions())
    try:
        # the first step (tracing, kernel set-up) outside the timed region and undone, as
        # train does: the stream holds exactly the epochs' batches (each epoch its own)
        trainer.warm_up(False)
        batches = trainer.train_batches(0)
        steps = trainer.steps_per_epoch * epochs
        start = time.perf_counter()
        for _ in range(steps):
            loss = trainer.train_step(next(batches))
        float(loss)
        return steps * trainer.global_batch / (time.perf_counter() - start)
    finally:
        trainer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="config overrides for both sides, e.g. data.train_examples=16384",
    )
    parser.add_argument("--tensorboard", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--framework", choices=("tensorflow", "pytorch"), default="tensorflow")
    parser.add_argument("--one", choices=("full", "bare"))
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.one:
        if args.framework == "pytorch":
            sys.modules["tensorflow"] = None  # torch's process never loads it (see the feeder)
        if args.one == "full":
            rate = measure_full(
                args.preset, args.epochs, args.set, args.tensorboard, args.framework
            )
        else:
            rate = measure_bare(args.preset, args.epochs, args.set, args.framework)
        print(json.dumps({"examples_per_s": rate}))
        return
    rates = {"full": [], "bare": []}
    for round_index in range(args.rounds):
        # Alternate which goes first, so a drift within a round favours neither.
        for kind in ("full", "bare") if round_index % 2 == 0 else ("bare", "full"):
            result = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    kind,
                    "--preset",
                    args.preset,
                    "--epochs",
                    str(args.epochs),
                    *(f"--set={s}" for s in args.set),
                    "--tensorboard" if args.tensorboard else "--no-tensorboard",
                    "--framework",
                    args.framework,
                ],
                capture_output=True,
                text=True,
            )
            if result.returncode != 0:
                raise SystemExit(f"{kind} failed:\n{result.stderr[-2000:]}")
            rates[kind].append(json.loads(result.stdout.strip().splitlines()[-1])["examples_per_s"])
    full, bare = statistics.median(rates["full"]), statistics.median(rates["bare"])
    print(
        f"{args.framework}, preset {args.preset} {' '.join(args.set)}, {args.epochs} epochs of "
        "random data, "
        f"median of {args.rounds}, TensorBoard {'on' if args.tensorboard else 'off'}"
    )
    print(
        f"  full train command {full:8.1f} examples/s   (runs: "
        f"{', '.join(f'{r:.1f}' for r in rates['full'])})"
    )
    print(
        f"  bare step loop     {bare:8.1f} examples/s   (runs: "
        f"{', '.join(f'{r:.1f}' for r in rates['bare'])})"
    )
    round_ratios = [f / b for f, b in zip(rates["full"], rates["bare"], strict=True)]
    print(
        f"  full / bare        {full / bare:.3f}x; per round "
        + " ".join(f"{r:.3f}" for r in round_ratios)
        + f", median {statistics.median(round_ratios):.3f}x"
    )


if __name__ == "__main__":
    main()
