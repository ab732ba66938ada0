"""Where the train step's time goes, by op type: the TensorFlow profiler's trace of a few train
steps of the reference preset's ResNet-50 v1.5 (random data, default strategy), or a trace
that `hpcai500-tf train --profile-steps A-B` wrote (`--trace DIR`).

Sums the duration of every op event on TensorFlow's compute threads by op type (busy time:
ops that ran side by side on two threads count twice), and prints each type's time per step
and share of the busy time, largest first. To compare two checkouts, run it from each (the
project is imported from the checkout the script is in when PYTHONPATH names it).

    python benchmarks/step_profile.py [--precision mixed] [--batch 32] [--steps 2]
    python benchmarks/step_profile.py --trace RUN_DIR/tensorboard
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
from pathlib import Path

# Events on the compute threads that are the executor's own, not an op's.
NOT_OPS = ("ThreadpoolListener", "ExecutorState", "FunctionRun", "Executor")


def op_times(trace: Path) -> collections.Counter:
    """Seconds of op events by op type over every xplane file under `trace`."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    seconds: collections.Counter = collections.Counter()
    files = sorted(trace.glob("**/*.xplane.pb")) if trace.is_dir() else [trace]
    if not files:
        raise SystemExit(f"{trace}: no *.xplane.pb trace there")
    for path in files:
        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        for plane in space.planes:
            for line in plane.lines:
                if not line.name.startswith("tf_Compute"):
                    continue
                for event in line.events:
                    meta = plane.event_metadata[event.metadata_id]
                    if ":" not in meta.name or meta.name.startswith(NOT_OPS):
                        continue
                    op_type = meta.display_name or meta.name.rsplit(":", 1)[-1]
                    seconds[op_type] += event.duration_ps * 1e-12
    return seconds


def traced_steps(precision: str, batch: int, image_size: int, steps: int, out: Path) -> None:
    """Trace `steps` train steps, after one untraced, into `out`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from resnet_step import reference_engine

    engine, (images, labels) = reference_engine(precision, batch, image_size)
    step = engine.traced_train_step  # (images, labels)
    float(step(images, labels))
    tf.profiler.experimental.start(str(out))
    for _ in range(steps):
        float(step(images, labels))
    tf.profiler.experimental.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="mixed", choices=("fp32", "mixed"))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=2, help="steps traced")
    parser.add_argument("--trace", help="read this trace (a file or a directory) instead")
    parser.add_argument("--top", type=int, default=25, help="op types printed")
    parser.add_argument("--json", help="also write the seconds per step by op type here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpcai500-step-profile-") as scratch:
        if args.trace:
            trace, steps = Path(args.trace), args.steps
        else:
            trace, steps = Path(scratch), args.steps
            traced_steps(args.precision, args.batch, args.image_size, steps, trace)
        seconds = op_times(trace)
    busy = sum(seconds.values())
    print(f"busy time by op type over {steps} step(s): {busy / steps:.3f} s per step")
    for op_type, total in seconds.most_common(args.top):
        print(f"  {op_type:36s} {total / steps * 1e3:9.1f} ms  {total / busy:6.1%}")
    if args.json:
        per_step = {op: total / steps for op, total in seconds.most_common()}
        Path(args.json).write_text(json.dumps(per_step, indent=2) + "\n")


if __name__ == "__main__":
    main()
