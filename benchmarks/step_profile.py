"""Where the train step's time goes, by op type: the TensorFlow profiler's trace of a few train
steps of the reference preset's ResNet-50 v1.5 (random data, default strategy), or a trace
that `hpcai500-tf train --profile-steps A-B` wrote (`--trace DIR`).

Sums the duration of every op event on TensorFlow's compute threads by op type (busy time:
ops that ran side by side on two threads count twice), and prints each type's time per step
and share of the busy time, largest first; then how the traced window's wall time divides
into time with no op running on those threads, one, and two or more (ops side by side share
the cores' intra-op threads; time with none is the executor's own, or Python's between
steps). To compare two checkouts, run it from each (the
project is imported from the checkout the script is in when PYTHONPATH names it).

    python benchmarks/step_profile.py [--precision mixed] [--batch 32] [--steps 2]
    python benchmarks/step_profile.py --set "model.kernels='cpu-workarounds'"
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


def op_times(trace: Path, intervals: list | None = None) -> collections.Counter:
    """Seconds of op events by op type over every xplane file under `trace`; each op event's
    (start, end) in picoseconds is appended to `intervals` when one is given."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    seconds: collections.Counter = collections.Counter()
    files = sorted(trace.glob("**/*.xplane.pb")) if trace.is_dir() else [trace]
    if not files:
        raise SystemExit(f"{trace}: no *.xplane.pb trace there")
    intervals = [] if intervals is None else intervals
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
                    start = line.timestamp_ns * 1000 + event.offset_ps
                    intervals.append((start, start + event.duration_ps))
    return seconds


def occupancy(intervals: list) -> dict:
    """Seconds of the window from the first op's start to the last op's end during which 0, 1
    and 2 or more ops ran (a sweep over the intervals' ends)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    spans = collections.Counter()
    running, previous = 0, edges[0][0] if edges else 0
    for time, change in edges:
        spans[min(running, 2)] += (time - previous) * 1e-12
        running, previous = running + change, time
    return {"none": spans[0], "one": spans[1], "two or more": spans[2]}


def traced_steps(
    precision: str, batch: int, image_size: int, steps: int, out: Path, overrides=()
) -> None:
    """Trace `steps` train steps into `out`, after one untraced and one traced into a scratch
    directory: the profiler's first traced step ran 1.9x as long as the next ones (the stage-2
    batch norms 12x: 100 against 8 ms each, bf16 on an AMX Xeon), so it is left out."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from resnet_step import reference_engine

    engine, (images, labels) = reference_engine(precision, batch, image_size, overrides)
    step = engine.traced_train_step  # (images, labels)
    float(step(images, labels))
    with tempfile.TemporaryDirectory(prefix="hpcai500-profiler-warm-up-") as warm_up:
        tf.profiler.experimental.start(warm_up)
        float(step(images, labels))
        tf.profiler.experimental.stop()
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
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config override"
    )
    args = parser.parse_args()
    if args.trace and args.set:
        parser.error("--set applies to the steps traced here, not to a --trace read")
    with tempfile.TemporaryDirectory(prefix="hpcai500-step-profile-") as scratch:
        if args.trace:
            trace, steps = Path(args.trace), args.steps
        else:
            trace, steps = Path(scratch), args.steps
            traced_steps(args.precision, args.batch, args.image_size, steps, trace, args.set)
        intervals: list = []
        seconds = op_times(trace, intervals)
    busy = sum(seconds.values())
    print(f"busy time by op type over {steps} step(s): {busy / steps:.3f} s per step")
    for op_type, total in seconds.most_common(args.top):
        print(f"  {op_type:36s} {total / steps * 1e3:9.1f} ms  {total / busy:6.1%}")
    spans = occupancy(intervals)
    window = sum(spans.values())
    print(
        f"traced window {window / steps:.3f} s per step; ops running: "
        + ", ".join(f"{n} {t / steps:.3f} s ({t / window:.0%})" for n, t in spans.items())
    )
    if args.json:
        per_step = {op: total / steps for op, total in seconds.most_common()}
        Path(args.json).write_text(json.dumps(per_step, indent=2) + "\n")


if __name__ == "__main__":
    main()
