"""Train-step throughput of ResNet-50 v1.5: this project's TensorFlow step against a plain
PyTorch step (channels-last, same batch, same machine, same run).

Each (framework, precision) runs in its own process, interleaved over rounds so that drift on
a shared machine hits both sides alike. Per step: forward, loss, backward, SGD update; the
timing syncs by reading the loss back. Reports the median images/s over all rounds, the
TF/PyTorch ratio of those medians and the median of the per-round ratios (each round's two
runs are neighbours in time), and the kernel (system) time each side spends per step: page
faults from an allocator that hands large buffers back to the OS show up there.
`--keep-freed-memory` runs both sides with glibc told to keep freed memory (no mmap, no trim),
which removes those faults for an allocator that relies on malloc.

    python benchmarks/train_step_vs_pytorch.py [--batch 32] [--image-size 224] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tf_step_times(precision: str, batch: int, image_size: int, steps: int, warmup: int):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from hpcai500_tf.config import prepare
    from hpcai500_tf.engine.run import build_engine

    setup = prepare(
        "image_classification",
        "reference",
        [
            "data.source='random'",
            f"data.image_size={image_size}",
            "data.num_classes=1000",
            f"training.batch_per_replica={batch}",
            "training.strategy='default'",
            f"training.precision='{precision}'",
        ],
    )
    engine = build_engine(setup, None)
    images, labels = next(engine.train_batches())
    # Reading the loss back syncs.
    import tensorflow as tf

    timed = timed_steps(lambda: float(engine.train_step((images, labels))), steps, warmup)
    return {**timed, "build": f"TensorFlow {tf.__version__}"}


def timed_steps(step, steps: int, warmup: int) -> dict:
    """Seconds of each timed step, and system (kernel) seconds per timed step."""
    for _ in range(warmup):
        step()
    times = []
    system_before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    system = resource.getrusage(resource.RUSAGE_SELF).ru_stime - system_before
    return {"times": times, "system_seconds_per_step": system / steps}


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
    command = [
        sys.executable,
        __file__,
        "--one",
        framework,
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
    env = dict(os.environ)
    if args.keep_freed_memory:
        env.update(MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(2**40))
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{framework} {precision} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precisions", default="fp32,mixed")
    parser.add_argument("--keep-freed-memory", action="store_true")
    parser.add_argument("--one", nargs=2, metavar=("FRAMEWORK", "PRECISION"))
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.one:
        framework, precision = args.one
        timer = tf_step_times if framework == "tensorflow" else torch_step_times
        print(json.dumps(timer(precision, args.batch, args.image_size, args.steps, args.warmup)))
        return
    precisions = args.precisions.split(",")
    frameworks = ("tensorflow", "pytorch")
    runs = {(fw, p): [] for fw in frameworks for p in precisions}
    for _ in range(args.rounds):
        for precision in precisions:
            for framework in frameworks:
                runs[(framework, precision)].append(run_one(framework, precision, args))
    rows = []
    for fw in frameworks:
        print(f"{fw}: {runs[(fw, precisions[0])][0]['build']}")
    print(
        f"ResNet-50 v1.5 train step, batch {args.batch}, {args.image_size}x{args.image_size}, "
        f"{args.steps} steps x {args.rounds} rounds (images/s, median)"
        + (", glibc keeping freed memory" if args.keep_freed_memory else "")
    )
    for precision in precisions:
        rate, system = {}, {}
        for fw in frameworks:
            times = [t for run in runs[(fw, precision)] for t in run["times"]]
            rate[fw] = args.batch / statistics.median(times)
            system[fw] = statistics.median(
                r["system_seconds_per_step"] for r in runs[(fw, precision)]
            )
        round_ratios = [
            statistics.median(pt["times"]) / statistics.median(tf_run["times"])
            for tf_run, pt in zip(
                runs[("tensorflow", precision)], runs[("pytorch", precision)], strict=True
            )
        ]
        ratio = rate["tensorflow"] / rate["pytorch"]
        label = "fp32" if precision == "fp32" else "bf16 (mixed)"
        print(
            f"  {label:13s} TensorFlow {rate['tensorflow']:7.2f}   PyTorch "
            f"{rate['pytorch']:7.2f}   TF/PyTorch {ratio:.3f}x; per round "
            + " ".join(f"{r:.3f}" for r in round_ratios)
            + f", median {statistics.median(round_ratios):.3f}x"
        )
        print(
            f"  {'':13s} kernel time per step: TensorFlow {system['tensorflow']:.2f} s, "
            f"PyTorch {system['pytorch']:.2f} s"
        )
        rows.append(
            {
                "precision": precision,
                "tensorflow_images_per_s": rate["tensorflow"],
                "pytorch_images_per_s": rate["pytorch"],
                "ratio": ratio,
                "round_ratios": round_ratios,
                "median_round_ratio": statistics.median(round_ratios),
                "system_seconds_per_step": system,
                "builds": {fw: runs[(fw, precision)][0]["build"] for fw in frameworks},
            }
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
