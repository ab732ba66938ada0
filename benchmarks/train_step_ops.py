"""Ops per train step, per replica: this project's ResNet-50 v1.5 train step (the reference
preset's model, optimizer and weight decay) traced, and its graph's ops counted by type.

The count is deterministic (no timing): the ops of the traced train function's graph and of
every function it calls (a loss-scale cond counts both its branches, once each). "kernels"
leaves out what launches no kernel (Const, Identity, NoOp, ReadVariableOp and the like), the
figure that stands for kernel launches on a GPU. Per step variant:

- fp32 and bf16 mixed precision on the CPU kernel sets ("cpu-workarounds", and
  "cpu-native-batch-norm", whose ops must build here),
- fp32, bf16 and float16 mixed precision on the GPU kernel set ("gpu-fused-batch-norm"),
  which builds and traces on a CPU; float16 is the policy GPUs train with (dynamic loss
  scaling included).

The image size changes the graph only where the CPU kernel set in bfloat16 gives layers over
small inputs (up to 7x7) another filter gradient (`models/kernels.py`); the default, 224, counts
the step that trains (tracing computes nothing, so the size costs no time).

    python benchmarks/train_step_ops.py [--by-type] [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
from pathlib import Path

# What launches no kernel: constants, graph plumbing, variable handles and reads (a read of a
# resource variable is a handle, not a copy, on CPUs and GPUs).
NOT_KERNELS = frozenset(
    {
        "Const",
        "Identity",
        "IdentityN",
        "NoOp",
        "Placeholder",
        "ReadVariableOp",
        "VarHandleOp",
        "StopGradient",
        "PartitionedCall",
        "StatefulPartitionedCall",
        "If",
        "StatelessIf",
    }
)

VARIANTS = (
    # (label, kernels choice, precision policy)
    ("fp32, cpu-workarounds", "cpu-workarounds", "float32"),
    ("bf16 mixed, cpu-workarounds", "cpu-workarounds", "mixed_bfloat16"),
    ("fp32, cpu-native-batch-norm", "cpu-native-batch-norm", "float32"),
    ("bf16 mixed, cpu-native-batch-norm", "cpu-native-batch-norm", "mixed_bfloat16"),
    ("fp32, gpu-fused-batch-norm", "gpu-fused-batch-norm", "float32"),
    ("bf16 mixed, gpu-fused-batch-norm", "gpu-fused-batch-norm", "mixed_bfloat16"),
    ("fp16 mixed, gpu-fused-batch-norm", "gpu-fused-batch-norm", "mixed_float16"),
    ("fp16 mixed, gpu-fused-batch-norm, xla", "gpu-fused-batch-norm", "mixed_float16"),
)


def _called(node) -> list[str]:
    """The names of the library functions a node calls (a call's or a cond's branches)."""
    names = []
    for value in node.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        names.extend(f.name for f in value.list.func)
    return names


def _compiled_functions(graph_def, library) -> set[str]:
    """The functions run by the calls XLA must compile (`_XlaMustCompile`), in the graph or
    in any library function."""
    nodes = [*graph_def.node, *(n for f in library.values() for n in f.node_def)]
    must = [n for n in nodes if "_XlaMustCompile" in n.attr and n.attr["_XlaMustCompile"].b]
    return {name for node in must for name in _called(node)}


def graph_op_types(graph_def, compiled_only: bool = False) -> collections.Counter:
    """Op types of a GraphDef's nodes and of every library function they call, recursively;
    `compiled_only`: only what the calls XLA must compile (`_XlaMustCompile`) run."""
    library = {f.signature.name: f for f in graph_def.library.function}
    counts: collections.Counter = collections.Counter()
    seen: set[str] = _compiled_functions(graph_def, library) if compiled_only else set()
    nodes = (
        [n for name in seen for n in library[name].node_def] if compiled_only else graph_def.node
    )

    def walk(nodes) -> None:
        for node in nodes:
            counts[node.op] += 1
            for name in _called(node):
                if name in library and name not in seen:
                    seen.add(name)
                    walk(library[name].node_def)

    walk(nodes)
    return counts


def kernel_count(counts: collections.Counter) -> int:
    return sum(n for op, n in counts.items() if op not in NOT_KERNELS)


def traced_step_ops(
    kernels: str,
    policy: str,
    image_size: int,
    batch: int,
    preset: str = "reference",
    xla: bool = False,
    compiled_only: bool = False,
) -> collections.Counter:
    """The op types of one traced train step of `preset` under `policy` (with `xla`, its loss
    and gradients compiled, `training.xla`; `compiled_only`: the compiled part's ops only)."""
    import keras

    from hpcai500_tf.config import prepare
    from hpcai500_tf.engine import loop
    from hpcai500_tf.engine.run import build_engine

    setup = prepare(
        "image_classification",
        preset,
        [
            "data.source='random'",
            f"data.image_size={image_size}",
            f"training.batch_per_replica={batch}",
            "training.strategy='default'",
            f"training.precision='{'fp32' if policy == 'float32' else 'mixed'}'",
            f"training.xla={str(xla).lower()}",
            f"model.kernels={kernels}",  # any set, on any device
        ],
    )
    chosen = loop.precision_policy
    loop.precision_policy = lambda precision: policy  # float16 as on GPUs, on any device
    try:
        engine = build_engine(setup, None)
        images, labels = engine.synthetic_batch()
        step = engine.traced_train_step  # (images, labels)
        traced = step.get_concrete_function(images, labels)
        return graph_op_types(traced.graph.as_graph_def(), compiled_only)
    finally:
        loop.precision_policy = chosen
        keras.mixed_precision.set_global_policy("float32")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--by-type", action="store_true", help="print the count of each op type")
    parser.add_argument("--variants", help="labels to count, separated by ';' (default: all)")
    parser.add_argument("--json", help="also write the counts here")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    wanted = {v.strip() for v in args.variants.split(";")} if args.variants else None
    results = {}
    for label, kernels, policy in VARIANTS:
        if wanted and label not in wanted:
            continue
        xla = label.endswith(", xla")
        counts = traced_step_ops(kernels, policy, args.image_size, args.batch, xla=xla)
        results[label] = {
            "ops": sum(counts.values()),
            "kernels": kernel_count(counts),
            "by_type": dict(counts.most_common()),
        }
        line = (
            f"{label:38s} ops {results[label]['ops']:6d}   kernels {results[label]['kernels']:6d}"
        )
        if xla:  # the part XLA compiles, whose kernels XLA fuses further on the device
            inside = traced_step_ops(
                kernels, policy, args.image_size, args.batch, xla=True, compiled_only=True
            )
            results[label]["compiled_ops"] = sum(inside.values())
            results[label]["compiled_kernels"] = kernel_count(inside)
            line += (
                f"   (compiled by XLA: {kernel_count(inside)} of the kernels, before its fusion)"
            )
        print(line)
        if args.by_type:
            for op, n in counts.most_common():
                mark = " " if op not in NOT_KERNELS else "-"
                print(f"    {mark} {op:32s} {n:5d}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
