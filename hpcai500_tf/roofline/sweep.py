"""The roofline sweep: ceilings per dtype, then the workload's points, into one JSON record."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from hpcai500_tf import __version__, backends
from hpcai500_tf import record as record_io
from hpcai500_tf.cluster import machine
from hpcai500_tf.errors import UserError
from hpcai500_tf.files import check_output_directory
from hpcai500_tf.roofline import chart, peaks, timed_ops, workload

RECORD_KIND = "hpcai500-roofline"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class SweepPlan:
    """Sizes and times of a sweep; `quick` finishes in under a minute on 2 CPU cores."""

    gemm_sizes: tuple[int, ...]
    conv_batch: int
    conv_shapes: str  # "stage_3x3": the 3x3 conv of each stage; "all": every distinct shape
    stream_elements: int
    min_seconds: float
    dtypes: tuple[str, ...]
    seconds_per_dtype: float  # past this, a dtype's remaining measurements are skipped
    chain: int = 1  # dependent kernels per loop iteration: the loop's cost spread over them
    device: str = "cpu"  # what the plan is sized for: "cpu" (host memory) or "gpu"


QUICK = SweepPlan((256, 512, 1024), 8, "stage_3x3", 1 << 25, 0.05, ("fp32", "bf16"), 20)
FULL = SweepPlan(
    (256, 512, 1024, 2048, 4096),
    32,
    "all",
    1 << 27,
    0.2,
    ("fp64", "fp32", "tf32", "bf16", "fp16"),
    150,
)
# A GPU's kernels at the CPU sizes take microseconds, less than a loop iteration costs to
# launch: sizes that fill the chip (streams of 1 and 4 GiB), 8 dependent kernels an iteration.
QUICK_GPU = dataclasses.replace(
    QUICK,
    gemm_sizes=(2048, 4096, 8192),
    conv_batch=128,
    stream_elements=1 << 28,
    chain=8,
    device="gpu",
)
FULL_GPU = dataclasses.replace(
    FULL,
    gemm_sizes=(1024, 2048, 4096, 8192, 16384),
    conv_batch=256,
    stream_elements=1 << 30,
    chain=8,
    device="gpu",
)


def resnet50_conv_shapes(plan: SweepPlan) -> list[timed_ops.ConvShape]:
    """The distinct convolution shapes of ResNet-50 v1.5 at 224x224 (SPEC: the IC model)."""
    from hpcai500_tf.models.resnet import resnet50_v15

    shapes = [s for s, _ in workload.layer_shapes(resnet50_v15(), plan.conv_batch) if s.height > 1]
    if plan.conv_shapes == "stage_3x3":
        shapes = [s for s in shapes if s.kernel == 3 and s.stride == 1]
    return shapes


def weather_conv_shapes(plan: SweepPlan) -> list[timed_ops.ConvShape]:
    """The extreme-weather detector's first layers at the published resolution (768 x 1152 x
    16 channels, batch 1): the stem and the first bottleneck, the largest maps it convolves.
    Full sweep only (they take seconds each)."""
    if plan.conv_shapes != "all":
        return []
    import keras

    from hpcai500_tf.models.resnet import resnet_backbone

    images = keras.Input((768, 1152, 16))
    first_stage = keras.Model(images, resnet_backbone(images, last_stage=2)[0])
    return [s for s, _ in workload.layer_shapes(first_stage, 1)]


def _fits(bytes_needed: float) -> bool:
    """Refuse sizes that would not fit: a quarter of physical memory at most."""
    total = machine.hardware_layer().get("memory_bytes") or 0
    return not total or bytes_needed < total / 4


def device_kind() -> str:
    """What the sweep computes on: "gpu" where TensorFlow sees one (it places kernels there)."""
    return "gpu" if tf.config.list_physical_devices("GPU") else "cpu"


def device_memory() -> tuple[int | None, str]:
    """(bytes or None, which) of the GPU the sweep runs on: the first the run uses, from NVML
    (TensorFlow reports only the memory in use, not the total)."""
    hardware = machine.hardware_layer()
    used = [g for g in hardware.get("accelerators") or [] if g.get("visible", True)]
    if not used:
        return None, hardware.get("accelerator_note") or "no GPU listed by NVML"
    return used[0]["memory_bytes"], f"GPU {used[0]['index']} ({used[0]['model']}, NVML)"


def largest_arrays(plan: SweepPlan, conv_shapes: list[timed_ops.ConvShape]) -> tuple[float, str]:
    """(bytes, what) of the measurement in the plan that holds the most memory at once."""
    itemsize = max(timed_ops.DTYPES[d].size for d in plan.dtypes)
    sizes = [(3.0 * plan.stream_elements * 4, f"stream arrays of {plan.stream_elements} fp32")]
    sizes += [
        (3.0 * n * n * itemsize, f"gemm {n}x{n} ({itemsize}-byte values)") for n in plan.gemm_sizes
    ]
    for s in conv_shapes:  # input, filter, output, and the input-shaped input gradient
        bytes_needed = s.bytes(itemsize) + s.batch * s.height * s.width * s.cin * itemsize
        sizes.append((bytes_needed, f"conv {s.name} at batch {s.batch} {s.pixels}"))
    return max(sizes)


def check_device_memory(plan_name: str, plan: SweepPlan, conv_shapes, say=print) -> None:
    """Refuse, before anything runs, a GPU plan whose largest measurement needs more than half
    the GPU's memory (the rest for TensorFlow's allocator and cuDNN's workspaces)."""
    if plan.device != "gpu":
        return  # on the host, each size is checked against host memory as it comes (_fits)
    total, which = device_memory()
    if not total:
        say(f"device memory unknown ({which}): the plan's sizes are not checked against it")
        return
    needed, what = largest_arrays(plan, conv_shapes)
    if needed > total / 2:
        raise UserError(
            f"the {plan_name} GPU roofline plan needs {needed / 2**30:.1f} GiB for {what}, more "
            f"than half of {which}'s {total / 2**30:.1f} GiB"
            + ("; try --quick" if plan_name == "full" else "")
        )


def measure_ceilings(plan: SweepPlan, conv_shapes: list[timed_ops.ConvShape], say=print) -> dict:
    """Memory bandwidth (STREAM kernels), then per dtype the GEMM and convolution rates,
    each dtype within its time bound; what was skipped is named with the reason."""
    hardware = machine.hardware_layer()
    results, skipped = {}, {}
    bandwidth = _measure_bandwidth(plan, skipped, say)
    best_bandwidth = max((b["bytes_per_s"] for b in bandwidth.values()), default=None)
    for dtype in plan.dtypes:
        reason = timed_ops.dtype_supported(dtype)
        if reason:
            skipped[dtype] = reason
            say(f"{dtype}: skipped ({reason})")
            continue
        deadline = time.perf_counter() + plan.seconds_per_dtype
        gemm = _measure_gemm(plan, dtype, deadline, skipped, say)
        convs = _measure_convs(plan, dtype, conv_shapes, deadline, skipped, say)
        gemm_peak = max((g["flops"] for g in gemm), default=None)
        conv_peak = max((c["flops"] for c in convs), default=None)
        if gemm_peak is None and conv_peak is None:
            continue
        compute = max(v for v in (gemm_peak, conv_peak) if v is not None)
        peak, peak_method = peaks.theoretical_peak(dtype, hardware)
        efficiency, peak_warning = peaks.efficiency(compute, peak, peak_method)
        if peak_warning:
            say(f"{dtype}: {peak_warning}")
        results[dtype] = {
            "gemm": gemm,
            "conv": convs,
            "gemm_ceiling": gemm_peak,
            "conv_ceiling": conv_peak,
            "ridge_point": compute / best_bandwidth if best_bandwidth else None,
            "theoretical_peak": peak,
            "theoretical_peak_method": peak_method,
            "efficiency": efficiency,
            "peak_warning": peak_warning,
        }
    return {
        "bandwidth": bandwidth,
        "bandwidth_ceiling": best_bandwidth,
        "dtypes": results,
        "skipped": skipped,
    }


def _measure_bandwidth(plan: SweepPlan, skipped: dict, say) -> dict:
    bandwidth = {}
    for name in timed_ops.STREAM_KERNELS:
        if not _fits(3 * plan.stream_elements * 4):
            skipped[f"stream {name}"] = "arrays do not fit in memory"
            continue
        rate, timing = timed_ops.stream(
            name, plan.stream_elements, "fp32", plan.min_seconds, plan.chain
        )
        bandwidth[name] = {"bytes_per_s": rate, "spread": timing.spread}
        say(f"stream {name:5s} {rate / 1e9:8.1f} GB/s")
    return bandwidth


def _measure_gemm(plan: SweepPlan, dtype: str, deadline: float, skipped: dict, say) -> list:
    itemsize = timed_ops.DTYPES[dtype].size
    gemm, rate = [], None
    for n in plan.gemm_sizes:
        if not _fits(3 * n * n * itemsize):
            skipped[f"{dtype} gemm {n}"] = "does not fit in memory"
            continue
        # A repetition at this size must fit the time left several times over.
        if rate and 2 * n**3 / rate * 10 * plan.chain > deadline - time.perf_counter():
            skipped[f"{dtype} gemm {n}+"] = "beyond this dtype's time bound"
            break
        rate, timing, layout = timed_ops.gemm(n, dtype, plan.min_seconds, chain=plan.chain)
        gemm.append({"n": n, "flops": rate, "spread": timing.spread, "layout": layout})
        say(f"{dtype} gemm {n:5d} {rate / 1e9:9.1f} GFLOP/s ({layout})")
    return gemm


def _measure_convs(plan, dtype, conv_shapes, deadline, skipped, say) -> list:
    """Each shape's three passes (forward, input gradient, filter gradient)."""
    convs, slowest = [], None
    for index, shape in enumerate(conv_shapes):
        if time.perf_counter() > deadline:
            skipped[f"{dtype} conv"] = (
                f"time bound reached after {index} of {len(conv_shapes)} shapes"
            )
            break
        # Its three passes, a few repetitions each at the slowest pass rate seen so far,
        # must fit the time left: one TensorFlow call cannot be interrupted.
        if (
            slowest
            and 3 * 3 * shape.flops() * plan.chain / slowest > deadline - time.perf_counter()
        ):
            skipped[f"{dtype} conv {shape.name} {shape.pixels}"] = "beyond this dtype's time bound"
            continue
        rates = []
        for direction in ("forward", "backward_input", "backward_filter"):
            rate, timing = timed_ops.conv(shape, dtype, direction, plan.min_seconds, plan.chain)
            rates.append(rate)
            convs.append(
                {"shape": shape.__dict__, "direction": direction, "flops": rate,
                 "spread": timing.spread}
            )  # fmt: skip
        slowest = min(rates) if slowest is None else min(slowest, *rates)
        say(
            f"{dtype} conv {shape.kernel}x{shape.kernel}/{shape.stride} {shape.pixels:>5s} "
            f"{shape.cin:4d}->{shape.cout:<4d} fwd/bwd-in/bwd-filter "
            + " / ".join(f"{r / 1e9:.1f}" for r in rates)
            + " GFLOP/s"
        )
    return convs


def workload_points(engine, min_seconds: float, say=print, chain: int = 1) -> dict:
    """The engine's model: each layer alone (`chain` per loop iteration), and its whole train
    step, at its batch."""
    dtype = (
        "bf16"
        if engine.policy == "mixed_bfloat16"
        else ("fp16" if engine.policy == "mixed_float16" else "fp32")
    )
    itemsize = timed_ops.DTYPES[dtype].size
    shapes = workload.layer_shapes(engine.model, engine.global_batch)
    points = workload.layer_points(shapes, dtype, itemsize, min_seconds, chain=chain)
    batch = engine.zero_batch
    step_flops = engine.step_flops(batch).total
    engine.warm_up()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        float(engine.train_step(batch))
        times.append(time.perf_counter() - start)
    seconds = sorted(times)[1]
    traffic = workload.step_traffic_bytes(shapes, itemsize)
    say(f"train step: {step_flops / seconds / 1e9:.1f} GFLOP/s at batch {engine.global_batch}")
    return {
        "dtype": dtype,
        "batch": engine.global_batch,
        "layers": points,
        "step": {
            "flops": step_flops,
            "seconds": seconds,
            "achieved_flops": step_flops / seconds,
            "bytes": traffic,
            "operational_intensity": step_flops / traffic,
            "flops_method": "TF registered op statistics of the traced train step",
            "bytes_method": "minimum per layer: input, weights, output in 3 passes",
        },
    }


def _devices_of(record: dict) -> tuple[int, str]:
    """How many of the devices a roofline measures the run computed on: its GPUs (every
    worker's), else its nodes (a CPU roofline is one node's); refused where it does not say."""
    from hpcai500_tf.results.scoring import system_facts  # TensorFlow-free, imported late

    facts = system_facts(record)
    if facts["accelerators"]:
        return facts["accelerators"], "GPU"
    if facts["nodes"]:
        return facts["nodes"], "node"
    raise UserError(
        "--record: the record does not say on how many nodes it ran (L3 nodes), so its FLOPS "
        "cannot be put on one node's roofline"
    )


def record_point(record: dict, engine) -> dict:
    """A finished training run on the roofline: its achieved FLOPS per device (per GPU, or per
    node on CPUs, as the roofs are one device's) and its step intensity."""
    epochs = record["timeline"]["epochs"]
    if not epochs:
        raise ValueError("the record has no trained epochs")
    examples = epochs[-1]["examples"]
    seconds = sum(s["stop"] - s["start"] for s in record["timeline"]["segments"])
    itemsize = 2 if "16" in str(record["layers"]["L7"].get("precision")) else 4
    shapes = workload.layer_shapes(engine.model, 1)
    traffic_per_example = workload.step_traffic_bytes(shapes, itemsize)
    flops_per_example = record["flops"]["per_example_training"]
    devices, device = _devices_of(record)
    run_flops = flops_per_example * examples / seconds
    return {
        "achieved_flops": run_flops / devices,
        "run_flops": run_flops,
        "devices": devices,
        "per": device,
        "operational_intensity": flops_per_example / traffic_per_example,
        "examples": examples,
        "seconds": seconds,
    }


def new_record(
    plan_name: str, measured: dict, workload_result: dict | None, setup_info: dict, chain: int = 1
) -> dict:
    per_kernel = (
        f"; {chain} dependent kernels per iteration, the time per kernel the iteration's / {chain}"
        if chain > 1
        else ""
    )
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": RECORD_KIND,
        "plan": plan_name,
        "tool": {"name": "hpcai500-tf", "version": __version__},
        "layers": backends.get("tensorflow").system_layers(),
        "workload": workload_result,
        **setup_info,
        **measured,
        "timing_method": (
            "each repetition depends on the previous result inside one "
            "tf.function while loop; warm-up call, repetitions doubled to a "
            "minimum time, 5 timed calls, median; sync by reading a value back" + per_kernel
        ),
        "tensorflow": tf.__version__,
    }


def choose_plan(
    quick: bool, dtypes: str | None, device: str | None = None
) -> tuple[str, SweepPlan]:
    """The quick or full plan for the device ("cpu" or "gpu"; by default the one TensorFlow
    computes on), optionally limited to a comma-separated list of dtypes."""
    gpu = (device or device_kind()) == "gpu"
    name = "quick" if quick else "full"
    plan = (QUICK_GPU if gpu else QUICK) if quick else (FULL_GPU if gpu else FULL)
    if dtypes:
        unknown = set(dtypes.split(",")) - set(timed_ops.DTYPES)
        if unknown:
            raise UserError(
                f"unknown dtype {', '.join(sorted(unknown))} (known: {', '.join(timed_ops.DTYPES)})"
            )
        plan = dataclasses.replace(plan, dtypes=tuple(dtypes.split(",")))
    return name, plan


def run_sweep(
    setup,
    plan_name: str,
    plan: SweepPlan,
    out: Path,
    place_workload: bool = True,
    run_record: dict | None = None,
    record_path: str | None = None,
    say=print,
) -> tuple[dict, list[Path]]:
    """Measure the ceilings, place the workload (and a finished run), write roofline.json and
    the chart into the empty directory `out`; returns the result and the chart's files."""
    check_output_directory("--out", out)
    try:
        taken = out.exists() and any(out.iterdir())
    except OSError as error:
        raise UserError(f"--out {out}: cannot read it ({error.strerror or error})") from None
    if taken:
        raise UserError(f"{out}: exists and is not an empty directory; refusing to overwrite it")
    engine = backends.get("tensorflow").load().build_engine(setup, None)
    conv_shapes = resnet50_conv_shapes(plan) + weather_conv_shapes(plan)
    check_device_memory(plan_name, plan, conv_shapes, say)
    measured = measure_ceilings(plan, conv_shapes, say)
    work = workload_points(engine, plan.min_seconds, say, plan.chain) if place_workload else None
    where = {"benchmark": setup.benchmark.name, "preset": setup.preset}
    result = new_record(plan_name, measured, work, where, plan.chain)
    if run_record:
        result["run"] = {"record": str(record_path), **record_point(run_record, engine)}
    out.mkdir(parents=True, exist_ok=True)
    record_io.write_atomic(out / "roofline.json", result)
    return result, chart.draw(result, out / "roofline")
