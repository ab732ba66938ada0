"""The per-step stop agreement's cost (run/stop.py): the train step of two workers on this
machine with the agreement against the same step without it, in one run.

Two worker processes (TensorFlow: MultiWorkerMirroredStrategy over loopback gRPC; PyTorch:
torch.distributed over gloo) build the run's trainer as `train --workers 2` does, warm up,
then time alternating blocks of `--steps` steps: "plain" (`train_step(batch)`: the step
as before the stop vote existed: TensorFlow's loss all-reduce of one float; PyTorch's DDP
gradient all-reduce of the network alone, through a second DDP model without the ballot) and
"agreeing" (`agreed_stop()`, then `train_step(batch, 0)`: what the epoch loop runs on several
workers, the vote carried by the step's own reduction). Each block ends with the loss read
back (a device sync), so a block's time is its steps' whole time. `data.train_examples` is set
so that one epoch holds every block (each epoch opens its own stream, which costs far more than
a step). Blocks alternate over `--rounds` rounds, the first kind swapping each round; the
ratio is of the medians of seconds per step. One worker runs no agreement at all (a Python check).

    python benchmarks/stop_agreement_overhead.py [--framework tensorflow|pytorch]
        [--rounds 15] [--steps 32] [--preset smoke] [--set K=V ...]

Prints one JSON line from worker 0 (the method and both medians), then one line for people.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcai500_tf.cluster.machine import cpu_facts  # noqa: E402


def _block(trainer, batches, steps: int, agreeing: bool, models: dict | None) -> float:
    """Seconds per step over `steps` steps, the loss read at the end."""
    if models:  # PyTorch: the DDP model (and ballot) of this kind of step
        trainer.model, trainer.ballot = models[agreeing]
    started = time.perf_counter()
    for _ in range(steps):
        if agreeing:
            trainer.agreed_stop()
        loss = trainer.train_step(next(batches), 0 if agreeing else None)
    trainer.loss_value(loss)
    return (time.perf_counter() - started) / steps


def worker(args) -> None:
    from hpcai500_tf import backends, config
    from hpcai500_tf.run.options import RunOptions

    backend = backends.get(args.framework)
    # epochs enough for every block (each epoch is its own stream: train_batches ends)
    overrides = ["training.epochs=1000", *args.set, *backend.strategy_overrides(False)]
    setup = config.run_setup("image_classification", args.preset, overrides, None)
    # One epoch holds every block: opening an epoch's stream (run/data_position.py) costs
    # far more than a step, and blocks that open different numbers of them measure that.
    steps = (2 + 2 * args.rounds) * args.steps + 1
    examples = steps * setup.training.batch_per_replica * 2  # two workers, one replica each
    overrides.append(f"data.train_examples={examples}")
    setup = config.run_setup("image_classification", args.preset, overrides, None)
    backend.load()
    trainer = backend.build_trainer(setup, RunOptions(power_hz=0))
    try:
        trainer.warm_up(checkpoints=False)
        batches = trainer.train_batches(0)
        models = _pytorch_models(trainer)
        for agreeing in (True, False):  # each step's first runs' one-time costs (tracing)
            _block(trainer, batches, args.steps, agreeing, models)
        times = {"plain": [], "agreeing": []}
        for round_ in range(args.rounds):
            kinds = ("plain", "agreeing") if round_ % 2 == 0 else ("agreeing", "plain")
            for kind in kinds:
                block = _block(trainer, batches, args.steps, kind == "agreeing", models)
                times[kind].append(block)
        if trainer.rank == 0:
            _report(args, trainer, times)
    finally:
        trainer.close()


def _pytorch_models(trainer) -> dict | None:
    """PyTorch: {agreeing: (DDP model, ballot)}, the plain one a second DDP over the same
    network without the ballot (the step before the vote existed; with a ballot, every step
    must reduce it). Only the DDP whose forward pass ran reduces in a backward pass. None for
    TensorFlow, whose plain step is its own graph carrying no vote."""
    if trainer.framework != "pytorch":
        return None
    from hpcai500_tf.pytorch import distributed

    plain = distributed.wrap_model(trainer.torch, trainer.module, trainer.placement, trainer.device)
    return {True: (trainer.model, trainer.ballot), False: (plain, None)}


def _report(args, trainer, times: dict[str, list[float]]) -> None:
    plain, agreeing = (statistics.median(times[k]) for k in ("plain", "agreeing"))
    result = {
        "benchmark": "stop_agreement_overhead",
        "framework": args.framework,
        "workers": trainer.workers,
        "preset": args.preset,
        "overrides": args.set,
        "global_batch": trainer.global_batch,
        "rounds": args.rounds,
        "steps_per_block": args.steps,
        "plain_s_per_step": plain,
        "agreeing_s_per_step": agreeing,
        "ratio": agreeing / plain,
        "method": "median seconds per step of alternating blocks, each ending in a loss read",
        "cpu": cpu_facts()["cpu_model"],
    }
    print(json.dumps(result), flush=True)
    print(
        f"{args.framework}, 2 workers: {plain * 1e3:.2f} ms/step plain, "
        f"{agreeing * 1e3:.2f} ms/step agreeing: {agreeing / plain:.3f}x",
        flush=True,
    )


def launch(args, argv: list[str]) -> int:
    from hpcai500_tf.cluster import local_workers as launcher

    if args.framework == "tensorflow":
        environments = launcher.worker_environments(2, [], os.environ)
        for env, tf_config in zip(
            environments, launcher.tf_configs(launcher.free_ports(2)), strict=True
        ):
            env["TF_CONFIG"] = tf_config
    else:
        environments = launcher.torch_environments(2, launcher.free_ports(1)[0], os.environ)
    command = [sys.executable, __file__, "--worker", *argv]
    env_path = {"PYTHONPATH": str(ROOT)}
    workers = [
        subprocess.Popen(command, env={**env, **env_path}, stderr=subprocess.DEVNULL if i else None)
        for i, env in enumerate(environments)
    ]
    codes = [w.wait() for w in workers]
    return max(codes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("tensorflow", "pytorch"), default="tensorflow")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--set", action="append", default=[], metavar="K=V")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    argv = [a for a in sys.argv[1:] if a != "--worker"]
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    return launch(args, argv)


if __name__ == "__main__":
    sys.exit(main())
