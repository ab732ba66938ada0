"""The ResNet-50 v1.5 train step's share of this machine's convolution ceiling, both measured
in the same run.

Each round times, in fresh processes one after the other, the convolution ceiling of each
precision's dtype (what `hpcai500-tf roofline --quick --dtypes D --no-workload` measures:
the quick plan's GEMMs and convolutions of ResNet-50 and the weather model, the best rate of
every pass; fp32 for the fp32 step, bf16 for the mixed one) and the train step itself (as
train_step_vs_pytorch.py times it: median of the timed steps after the warm-up). The step's
FLOPs are the project's own count of its traced step (`Engine.step_flops`, TensorFlow's
registered op statistics) at the timed batch. Per round the share is the step's FLOP rate
over the ceiling measured next to it, so drift on a shared machine moves both; the median of
the rounds is reported, with each round's.

    python benchmarks/step_vs_ceiling.py [--precisions fp32,mixed] [--rounds 3] [--steps 5]
        [--batch 32] [--image-size 224] [--keep-freed-memory] [--json FILE]
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
from pathlib import Path

from resnet_step import benchmark_env, step_parser

ROOT = Path(__file__).resolve().parents[1]
DTYPE = {"fp32": "fp32", "mixed": "bf16"}  # each step precision's ceiling


def conv_ceiling(dtype: str, conv_batch: int | None) -> dict:
    """The quick roofline's ceilings of one dtype (FLOP/s), as the roofline command measures
    them; `conv_batch` replaces the plan's batch of the timed convolutions."""
    from hpcai500_tf.roofline import sweep

    plan = dataclasses.replace(sweep.QUICK, dtypes=(dtype,))
    if conv_batch:
        plan = dataclasses.replace(plan, conv_batch=conv_batch)
    shapes = sweep.resnet50_conv_shapes(plan) + sweep.weather_conv_shapes(plan)
    measured = sweep.measure_ceilings(plan, shapes, say=lambda _: None)
    if dtype not in measured["dtypes"]:
        raise SystemExit(f"{dtype}: not measured ({measured['skipped'].get(dtype, 'skipped')})")
    result = measured["dtypes"][dtype]
    return {"conv_ceiling": result["conv_ceiling"], "gemm_ceiling": result["gemm_ceiling"]}


def step_rate(precision: str, args) -> dict:
    """The train step's median seconds and its FLOPs per step (the traced step's count)."""
    from resnet_step import reference_engine
    from train_step_vs_pytorch import timed_steps

    engine, batch = reference_engine(precision, args.batch, args.image_size)
    flops = engine.step_flops(batch).total
    timed = timed_steps(lambda: float(engine.train_step(batch)), args.steps, args.warmup)
    return {"seconds": statistics.median(timed["times"]), "flops": flops}


def run_child(what: list[str], args) -> dict:
    """One measurement in a fresh process of this script; its JSON line."""
    command = [sys.executable, str(Path(__file__).resolve()), "--one", *what]
    for name in ("batch", "image_size", "steps", "warmup", "conv_batch"):
        if getattr(args, name) is not None:
            command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    env = {**benchmark_env(ROOT, args.keep_freed_memory), "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(what)} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def report(precision: str, rounds: list[dict]) -> dict:
    """Print one precision's rates and shares; return them as a row."""
    achieved = [r["step"]["flops"] / r["step"]["seconds"] for r in rounds]
    ceilings = [r["ceiling"]["conv_ceiling"] for r in rounds]
    shares = [a / c for a, c in zip(achieved, ceilings, strict=True)]
    label = "fp32" if precision == "fp32" else "bf16 (mixed)"
    print(
        f"  {label:13s} step {statistics.median(achieved) / 1e9:7.1f} GFLOP/s   "
        f"{DTYPE[precision]} conv ceiling {statistics.median(ceilings) / 1e9:7.1f} GFLOP/s   "
        f"share {100 * statistics.median(shares):.1f} %; per round "
        + " ".join(f"{100 * s:.1f}" for s in shares)
    )
    return {
        "precision": precision,
        "ceiling_dtype": DTYPE[precision],
        "step_flops": rounds[0]["step"]["flops"],
        "step_seconds": [r["step"]["seconds"] for r in rounds],
        "step_flops_per_s": achieved,
        "conv_ceilings": ceilings,
        "shares": shares,
        "median_share": statistics.median(shares),
    }


def main() -> None:
    parser = step_parser(__doc__, rounds=3)
    parser.add_argument("--precisions", default="fp32,mixed")
    parser.add_argument("--conv-batch", type=int, help="the ceiling's conv batch (plan's: 8)")
    parser.add_argument("--keep-freed-memory", action="store_true")
    parser.add_argument("--one", nargs=2, metavar=("WHAT", "PRECISION_OR_DTYPE"))
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.one:
        from hpcai500_tf.freed_memory import keep_freed_memory

        keep_freed_memory()  # as the project's commands run (train_step_vs_pytorch.py too)
        what, which = args.one  # ("ceiling", a dtype) or ("step", a precision)
        if what == "ceiling":
            print(json.dumps(conv_ceiling(which, args.conv_batch)))
        else:
            print(json.dumps(step_rate(which, args)))
        return
    precisions = args.precisions.split(",")
    unknown = set(precisions) - set(DTYPE)
    if unknown:
        raise SystemExit(f"--precisions: unknown {', '.join(sorted(unknown))} (fp32, mixed)")
    rounds = {p: [] for p in precisions}
    for _ in range(args.rounds):
        for precision in precisions:
            ceiling = run_child(["ceiling", DTYPE[precision]], args)
            step = run_child(["step", precision], args)
            rounds[precision].append({"ceiling": ceiling, "step": step})
    from hpcai500_tf.cluster.machine import cpu_facts

    cpu = cpu_facts()
    print(f"cpu: {cpu['cpu_model']} (family {cpu['cpu_family']}, model {cpu['cpu_model_number']})")
    print(
        f"ResNet-50 v1.5 train step, batch {args.batch}, {args.image_size}x{args.image_size}, "
        f"{args.steps} steps x {args.rounds} rounds, against the quick roofline's conv ceiling "
        "measured beside it" + (", glibc keeping freed memory" if args.keep_freed_memory else "")
    )
    rows = [report(precision, rounds[precision]) for precision in precisions]
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
