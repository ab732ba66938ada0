"""Train-step throughput of ResNet-50 v1.5: this project's TensorFlow step against a plain
PyTorch step (channels-last, same batch, same machine, same run).

Each (framework, precision) runs in its own process, interleaved over rounds so that drift on
a shared machine hits both sides alike. Per step: forward, loss, backward, SGD update; the
timing syncs by reading the loss back. Reports the median images/s over all rounds, the
TF/PyTorch ratio of those medians and the median of the per-round ratios (each round's two
runs are neighbours in time), and the kernel (system) time each side spends per step: page
faults from an allocator that hands large buffers back to the OS show up there.
This project's commands tell glibc to keep freed memory (no mmap, no trim: freed_memory.py),
and so does its TensorFlow side here; `--keep-freed-memory` sets the same for the PyTorch side
and a `--baseline` checkout from before that, which removes their faults too.
`--baseline DIR` times the TensorFlow step of another checkout of this project (e.g. the commit
before a change) in the same rounds, and reports this checkout's step against it: a
before/after ratio measured side by side. Each side imports the project from its own checkout.

    python benchmarks/train_step_vs_pytorch.py [--batch 32] [--image-size 224] [--steps 5]
        [--baseline DIR]
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from resnet_step import benchmark_env, step_parser

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "baseline"  # the TensorFlow step of the checkout at --baseline


def tf_step_times(
    precision: str, batch: int, image_size: int, steps: int, warmup: int, overrides=()
):
    """The TensorFlow step's times; `overrides` are more config overrides ("key=value").
    TensorFlow starts as the project's commands start it (glibc keeping freed memory, unless
    the checkout predates that)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        from hpcai500_tf.freed_memory import keep_freed_memory
    except ImportError:  # a --baseline checkout from before freed_memory.py
        pass
    else:
        keep_freed_memory()
    from resnet_step import reference_engine

    engine, (images, labels) = reference_engine(precision, batch, image_size, overrides)
    # Reading the loss back syncs.
    import tensorflow as tf

    timed = timed_steps(lambda: float(engine.train_step((images, labels))), steps, warmup)
    return {**timed, "build": f"TensorFlow {tf.__version__}"}


def timed_steps(step, steps: int, warmup: int) -> dict:
    """Seconds of each timed step, and system (kernel) seconds and minor page faults (memory
    the kernel had to map and zero: a count that load on the machine does not change) per
    timed step."""
    for _ in range(warmup):
        step()
    times = []
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "times": times,
        "system_seconds_per_step": (after.ru_stime - before.ru_stime) / steps,
        "minor_page_faults_per_step": (after.ru_minflt - before.ru_minflt) / steps,
    }


def torch_step_times(precision: str, batch: int, image_size: int, steps: int, warmup: int):
    import torch

    from hpcai500_tf.pytorch.resnet import ResNet50V15

    torch.manual_seed(0)
    model = ResNet50V15(1000).to(memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.1, momentum=0.875, weight_decay=3.0517578125e-05
    )
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    images = torch.rand(batch, 3, image_size, image_size).to(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,))

    from hpcai500_tf.pytorch.build import torch_build

    build = torch_build(torch)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "mixed"):
            loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        float(loss)

    return {**timed_steps(step, steps, warmup), "build": build}


def run_one(framework: str, precision: str, args) -> dict:
    """One (framework, precision) timed in its own process; "baseline" is the TensorFlow step
    of the checkout at `--baseline`, run from there."""
    root = Path(args.baseline).resolve() if framework == BASELINE else ROOT
    command = [
        sys.executable,
        str(root / "benchmarks" / Path(__file__).name),
        "--one",
        "tensorflow" if framework == BASELINE else framework,
        precision,
        "--batch",
        str(args.batch),
        "--image-size",
        str(args.image_size),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
    ]
    env = benchmark_env(root, args.keep_freed_memory)
    result = subprocess.run(command, capture_output=True, text=True, cwd=root, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{framework} {precision} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def round_ratios(runs: dict, precision: str, faster: str, slower: str) -> list[float]:
    """Per round, the median step time of `slower` over that of `faster`: neighbours in time."""
    return [
        statistics.median(slow["times"]) / statistics.median(fast["times"])
        for fast, slow in zip(runs[(faster, precision)], runs[(slower, precision)], strict=True)
    ]


def report_precision(runs: dict, precision: str, frameworks: tuple, batch: int) -> dict:
    """Print one precision's rates and ratios; return them as a row."""
    rate, system = {}, {}
    for fw in frameworks:
        times = [t for run in runs[(fw, precision)] for t in run["times"]]
        rate[fw] = batch / statistics.median(times)
        system[fw] = statistics.median(r["system_seconds_per_step"] for r in runs[(fw, precision)])
    ratios = round_ratios(runs, precision, "tensorflow", "pytorch")
    ratio = rate["tensorflow"] / rate["pytorch"]
    label = "fp32" if precision == "fp32" else "bf16 (mixed)"
    print(
        f"  {label:13s} TensorFlow {rate['tensorflow']:7.2f}   PyTorch "
        f"{rate['pytorch']:7.2f}   TF/PyTorch {ratio:.3f}x; per round "
        + " ".join(f"{r:.3f}" for r in ratios)
        + f", median {statistics.median(ratios):.3f}x"
    )
    row = {
        "precision": precision,
        "tensorflow_images_per_s": rate["tensorflow"],
        "pytorch_images_per_s": rate["pytorch"],
        "ratio": ratio,
        "round_ratios": ratios,
        "median_round_ratio": statistics.median(ratios),
        "system_seconds_per_step": system,
        "builds": {fw: runs[(fw, precision)][0]["build"] for fw in frameworks},
    }
    if BASELINE in frameworks:
        against = round_ratios(runs, precision, "tensorflow", BASELINE)
        print(
            f"  {'':13s} baseline TensorFlow {rate[BASELINE]:7.2f}   this/baseline "
            f"{rate['tensorflow'] / rate[BASELINE]:.3f}x; per round "
            + " ".join(f"{r:.3f}" for r in against)
            + f", median {statistics.median(against):.3f}x"
        )
        row.update(baseline_images_per_s=rate[BASELINE], baseline_round_ratios=against)
    print(
        f"  {'':13s} kernel time per step: "
        + ", ".join(f"{fw} {system[fw]:.2f} s" for fw in frameworks)
    )
    return row


def main() -> None:
    parser = step_parser(__doc__, rounds=2)
    parser.add_argument("--precisions", default="fp32,mixed")
    parser.add_argument("--keep-freed-memory", action="store_true")
    parser.add_argument("--one", nargs=2, metavar=("FRAMEWORK", "PRECISION"))
    parser.add_argument("--baseline", help="a checkout whose TensorFlow step is timed too")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.one:
        framework, precision = args.one
        timer = tf_step_times if framework == "tensorflow" else torch_step_times
        print(json.dumps(timer(precision, args.batch, args.image_size, args.steps, args.warmup)))
        return
    precisions = args.precisions.split(",")
    frameworks = ("tensorflow", "pytorch") + ((BASELINE,) if args.baseline else ())
    runs = {(fw, p): [] for fw in frameworks for p in precisions}
    for _ in range(args.rounds):
        for precision in precisions:
            for framework in frameworks:
                runs[(framework, precision)].append(run_one(framework, precision, args))
    for fw in frameworks:
        print(f"{fw}: {runs[(fw, precisions[0])][0]['build']}")
    print(
        f"ResNet-50 v1.5 train step, batch {args.batch}, {args.image_size}x{args.image_size}, "
        f"{args.steps} steps x {args.rounds} rounds (images/s, median)"
        + (", glibc keeping freed memory" if args.keep_freed_memory else "")
    )
    rows = [report_precision(runs, precision, frameworks, args.batch) for precision in precisions]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
