"""Ops per train step, per replica: this project's ResNet-50 v1.5 train step (the reference
preset's model, optimizer and weight decay) traced, and its graph's ops counted by type.

The count is deterministic (no timing): the ops of the traced train function's graph and of
every function it calls (a loss-scale cond counts both its branches, once each) that
TensorFlow executes: its function runtime prunes, before a step runs, every node that no
output, control output, stateful op or control flow depends on (`PruneFunctionBody`; the
zeros the gradient tape makes for outputs without a gradient, for example), and so does this
count ("traced nodes" counts them all). "kernels" leaves out what launches no kernel (Const,
Identity, NoOp, ReadVariableOp and the like), the figure that stands for kernel launches on a
GPU. Per step variant:

- fp32 and bf16 mixed precision on the CPU kernel sets ("cpu-workarounds", and
  "cpu-native-batch-norm", whose ops must build here),
- fp32, bf16 and float16 mixed precision on the GPU kernel set ("gpu-fused-batch-norm"),
  which builds and traces on a CPU; float16 is the policy GPUs train with (dynamic loss
  scaling included).

The image size changes the graph only where the CPU kernel set in bfloat16 gives layers over
small inputs (up to 7x7) another filter gradient (`models/kernels.py`); the default, 224, counts
the step that trains (tracing computes nothing, so the size costs no time). The bf16 CPU counts
also depend on the CPU that traces: some of those gradients are taken on AMX only.

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


# Node::IsControlFlow: kept by TensorFlow's pruning whatever depends on them (TF1 control flow).
CONTROL_FLOW = frozenset(
    {
        "Switch",
        "RefSwitch",
        "Merge",
        "RefMerge",
        "Enter",
        "RefEnter",
        "Exit",
        "RefExit",
        "NextIteration",
        "RefNextIteration",
        "LoopCond",
    }
)
# Stateful ops TensorFlow prunes all the same when nothing depends on them (function arguments;
# `PrunableStatefulNode` in TensorFlow's function_def_utils.cc).
PRUNABLE_STATEFUL = frozenset({"Placeholder", "_Arg", "ResourceGather", "ResourceGatherNd"})


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


def _source(ref: str) -> str:
    """The node an input names ("^node", "node:0", "node:output:0" in a function body)."""
    return ref.lstrip("^").split(":")[0]


def _executed(nodes, returned: set[str], library) -> list:
    """The nodes TensorFlow's function runtime runs (`PruneFunctionBody`): what a returned
    value, a control output, a stateful op or control flow depends on. The rest (zeros the
    gradient tape made for outputs that have no gradient, copies nothing reads) is pruned
    before the step runs."""
    from tensorflow.python.framework import op_def_registry

    def kept_whatever(node) -> bool:
        if node.name in returned or node.op in CONTROL_FLOW:
            return True
        if node.op in library:  # a call of a library function by its name
            return True
        op_def = op_def_registry.get(node.op)
        return op_def is not None and op_def.is_stateful and node.op not in PRUNABLE_STATEFUL

    by_name = {node.name: node for node in nodes}
    live: set[str] = set()
    pending = [node.name for node in nodes if kept_whatever(node)]
    while pending:
        name = pending.pop()
        if name in live or name not in by_name:  # a function argument is not a node
            continue
        live.add(name)
        pending.extend(_source(ref) for ref in by_name[name].input)
    return [node for node in nodes if node.name in live]


def graph_op_types(
    graph_def, compiled_only: bool = False, returned: set[str] | None = None
) -> collections.Counter:
    """Op types of a GraphDef's nodes and of every library function they call, recursively;
    `compiled_only`: only what the calls XLA must compile (`_XlaMustCompile`) run.
    `returned`: the names of the graph's output and control-output nodes: then only the nodes
    TensorFlow executes are counted (`_executed`), in the graph and in each function it calls;
    without it every traced node."""
    library = {f.signature.name: f for f in graph_def.library.function}
    counts: collections.Counter = collections.Counter()
    seen: set[str] = _compiled_functions(graph_def, library) if compiled_only else set()

    def body(nodes, outputs: set[str]) -> list:
        return nodes if returned is None else _executed(nodes, outputs, library)

    def function_body(name: str) -> list:
        function = library[name]
        outputs = {_source(ref) for ref in function.ret.values()}
        return body(function.node_def, outputs | set(function.control_ret.values()))

    def walk(nodes) -> None:
        for node in nodes:
            counts[node.op] += 1
            for name in _called(node):
                if name in library and name not in seen:
                    seen.add(name)
                    walk(function_body(name))

    if compiled_only:
        walk([n for name in seen for n in function_body(name)])
    else:
        walk(body(graph_def.node, returned or set()))
    return counts


def returned_nodes(func_graph) -> set[str]:
    """The names of a traced function's output and control-output nodes."""
    outputs = {tensor.op.name for tensor in func_graph.outputs}
    return outputs | {op.name for op in func_graph.control_outputs}


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
    executed: bool = True,
) -> collections.Counter:
    """The op types of one traced train step of `preset` under `policy` (with `xla`, its loss
    and gradients compiled, `training.xla`; `compiled_only`: the compiled part's ops only);
    those TensorFlow executes, or with `executed=False` every traced node."""
    graph_def, returned = traced_step_graph(kernels, policy, image_size, batch, preset, xla)
    return graph_op_types(graph_def, compiled_only, returned if executed else None)


def traced_step_graph(
    kernels: str, policy: str, image_size: int, batch: int, preset: str, xla: bool
) -> tuple:
    """(GraphDef, names of its output nodes) of one traced train step (`traced_step_ops`)."""
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
        return traced.graph.as_graph_def(), returned_nodes(traced.graph)
    finally:
        loop.precision_policy = chosen
        keras.mixed_precision.set_global_policy("float32")


def count_variant(label: str, kernels: str, policy: str, image_size: int, batch: int) -> dict:
    """The counts of one step variant: every traced node, the ops TensorFlow executes, their
    kernels, by type; under XLA, also the part XLA compiles."""
    xla = label.endswith(", xla")
    graph_def, returned = traced_step_graph(kernels, policy, image_size, batch, "reference", xla)
    counts = graph_op_types(graph_def, returned=returned)
    result = {
        "traced_nodes": sum(graph_op_types(graph_def).values()),
        "ops": sum(counts.values()),
        "kernels": kernel_count(counts),
        "by_type": dict(counts.most_common()),
    }
    if xla:  # the part XLA compiles, whose kernels XLA fuses further on the device
        inside = graph_op_types(graph_def, compiled_only=True, returned=returned)
        result["compiled_ops"] = sum(inside.values())
        result["compiled_kernels"] = kernel_count(inside)
    return result


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
        result = results[label] = count_variant(label, kernels, policy, args.image_size, args.batch)
        line = (
            f"{label:38s} ops {result['ops']:6d}   kernels {result['kernels']:6d}"
            f"   (traced nodes {result['traced_nodes']:6d})"
        )
        if "compiled_kernels" in result:
            compiled = result["compiled_kernels"]
            line += f"   compiled by XLA: {compiled} of the kernels, before its fusion"
        print(line)
        if args.by_type:
            for op, n in result["by_type"].items():
                mark = " " if op not in NOT_KERNELS else "-"
                print(f"    {mark} {op:32s} {n:5d}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
