"""The checks that need a GPU node, in one go, with one JSON summary (`tools/gpu_check.sh`).

    python tools/gpu_check.py [--out gpu_check.json] [--steps 30] [--batch 256]
    python tools/gpu_check.py --rehearse-on-cpu --out rehearsal.json   # the harness on a CPU

Checks, each in its own process under its own time limit (about 10 minutes in all):
  devices      the GPUs nvidia-smi lists and the ones TensorFlow sees (with compute capability)
  train_fp16   ResNet-50 v1.5 at 224x224, random data, mixed fp16 with loss scaling, one GPU:
               examples/s of the timed steps from the run's record
  train_bf16   the same in bfloat16 (refused by the project on GPUs without bf16)
  all_reduce   all-reduce of a 256 MiB float32 tensor across the node's GPUs (NCCL): median
               seconds per all-reduce and the bus bandwidth, 2 (n - 1) / n x bytes / seconds
  energy       the NVML energy of the GPU the fp16 run used, from that run's record: moving
               (more than 0 J) or not
  roofline     `hpcai500-tf roofline --quick`: the measured ceilings per dtype

`--rehearse-on-cpu` runs the same harness on a CPU-only machine (tiny preset, 2 logical CPU
devices reduced through one device instead of NCCL) so that the harness itself is tested; its
summary says it is a rehearsal and proves nothing about a GPU. Exit status 0 when every check
passed, 1 otherwise (the summary says which and why).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpcai500_tf.errors import ArgumentParser
from hpcai500_tf.tensorflow_import import keep_tensorflow_quiet

CLI = [sys.executable, "-m", "hpcai500_tf.cli"]
ALL_REDUCE_MIB = 256

ALL_REDUCE_SCRIPT = """
import json, statistics, sys, time
import tensorflow as tf
rehearse, mib, repeats = sys.argv[1] == "1", int(sys.argv[2]), int(sys.argv[3])
if rehearse:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    reduce_ops = tf.distribute.ReductionToOneDevice()
else:
    devices = [d.name for d in tf.config.list_logical_devices("GPU")]
    reduce_ops = tf.distribute.NcclAllReduce()
strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=reduce_ops)
n = strategy.num_replicas_in_sync
elements = mib * 2**20 // 4

def replica_value(context):
    return tf.fill([elements], tf.cast(context.replica_id_in_sync_group + 1, tf.float32))

values = strategy.experimental_distribute_values_from_function(replica_value)

@tf.function
def all_reduce(values):
    def step(x):
        # Each all-reduce takes the last one's result, so none can be merged or skipped.
        return tf.distribute.get_replica_context().all_reduce("sum", x) / n
    return strategy.run(step, (values,))

values = all_reduce(values)  # trace and warm up
seconds = []
for _ in range(repeats):
    start = time.perf_counter()
    values = all_reduce(values)
    float(strategy.experimental_local_results(values)[0][0])  # wait for the result
    seconds.append(time.perf_counter() - start)
expected = sum(range(1, n + 1)) / n
got = float(strategy.experimental_local_results(values)[0][0])
print(json.dumps({"replicas": n, "devices": devices, "seconds": seconds,
                  "value_correct": abs(got - expected) < 1e-3 * expected}))
"""

DEVICES_SCRIPT = """
import json
import tensorflow as tf
gpus = tf.config.list_physical_devices("GPU")
details = [tf.config.experimental.get_device_details(g) for g in gpus]
print(json.dumps({
    "tensorflow": tf.__version__,
    "built_with_cuda": tf.test.is_built_with_cuda(),
    "build_cuda": tf.sysconfig.get_build_info().get("cuda_version"),
    "build_cudnn": tf.sysconfig.get_build_info().get("cudnn_version"),
    "gpus": [{"name": g.name, "model": d.get("device_name"),
              "compute_capability": d.get("compute_capability")}
             for g, d in zip(gpus, details)],
}))
"""


def run_command(command: list[str], seconds: float, env: dict | None = None) -> dict:
    """Run a command under a time limit: {ok, code, seconds, stdout, stderr tail}."""
    start = time.monotonic()
    try:
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=seconds,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "code": None, "seconds": seconds, "stdout": "",
                "stderr": f"did not finish within {seconds:g} s"}  # fmt: skip
    return {
        "ok": result.returncode == 0,
        "code": result.returncode,
        "seconds": round(time.monotonic() - start, 2),
        "stdout": result.stdout,
        "stderr": result.stderr[-1500:],
    }


def last_line_json(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def nvidia_smi_gpus() -> tuple[list[str], str | None]:
    """(the GPU lines `nvidia-smi -L` prints, why there are none)."""
    if shutil.which("nvidia-smi") is None:
        return [], "nvidia-smi not found: no NVIDIA driver on this machine"
    listing = run_command(["nvidia-smi", "-L"], 60)
    if not listing["ok"]:
        return [], f"nvidia-smi -L failed: {listing['stderr'].strip()[-300:]}"
    lines = [line for line in listing["stdout"].splitlines() if line.startswith("GPU ")]
    return lines, None if lines else "nvidia-smi lists no GPU"


def check_devices(rehearse: bool) -> dict:
    listed, why_none = nvidia_smi_gpus()
    seen = run_command([sys.executable, "-c", DEVICES_SCRIPT], 300)
    tensorflow = last_line_json(seen["stdout"]) if seen["ok"] else None
    result = {"nvidia_smi": listed, "tensorflow": tensorflow, "seconds": seen["seconds"]}
    if tensorflow is None:
        return {**result, "status": "failed", "why": f"TensorFlow did not start: {seen['stderr']}"}
    if rehearse:
        return {**result, "status": "passed", "why": "rehearsal: no GPU expected"}
    if why_none:
        return {**result, "status": "failed", "why": why_none}
    if len(tensorflow["gpus"]) < len(listed):
        return {
            **result,
            "status": "failed",
            "why": f"TensorFlow sees {len(tensorflow['gpus'])} of the {len(listed)} GPUs "
            "nvidia-smi lists: CUDA's libraries did not load (pip install -e '.[cuda]')",
        }
    return {**result, "status": "passed"}


def check_train(precision: str, rehearse: bool, steps: int, batch: int, work: Path) -> dict:
    """A short throughput-only run on one device; examples/s from its record."""
    out = work / f"train-{precision}"
    if rehearse:
        preset = ["--preset", "tiny", "--set", "training.batch_per_replica=8"]
        examples, env = 8 * steps, {}
    else:
        preset = ["--preset", "reference", "--set", f"training.batch_per_replica={batch}"]
        examples, env = batch * steps, {"CUDA_VISIBLE_DEVICES": first_visible_gpu()}
    command = [
        *CLI, "train", "image_classification", *preset,
        "--set", "data.source=random", "--set", f"data.train_examples={examples}",
        "--set", "training.epochs=1", "--set", "training.strategy=default",
        "--set", "training.checkpoint_every=0", "--set", f"training.precision={precision}",
        "--no-tensorboard", "--out", str(out),
    ]  # fmt: skip
    result = run_command(command, 240, env)
    records = sorted(out.glob("*/record.json"))
    summary = {"command": " ".join(command[2:]), "seconds": result["seconds"]}
    if not result["ok"] or not records:
        return {**summary, "status": "failed", "why": result["stderr"].strip()[-600:]}
    record = json.loads(records[-1].read_text())
    seconds = sum(s["stop"] - s["start"] for s in record["timeline"]["segments"])
    return {
        **summary,
        "status": "passed",
        "record": str(records[-1]),
        "examples_per_s": record["timeline"]["epochs"][-1]["examples"] / seconds,
        "policy": record["layers"]["L7"].get("precision"),
        "loss_scaling": record["layers"]["L8"].get("loss_scaling"),
        "devices_used": record["layers"]["L5"].get("devices_used"),
        "energy": record["energy"],
    }


def first_visible_gpu() -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[0] if visible else "0"


def check_all_reduce(rehearse: bool, gpus: int) -> dict:
    if not rehearse and gpus < 2:
        return {"status": "not run", "why": f"{gpus} GPU(s): an all-reduce needs two"}
    mib = 4 if rehearse else ALL_REDUCE_MIB
    command = [sys.executable, "-c", ALL_REDUCE_SCRIPT, "1" if rehearse else "0", str(mib), "10"]
    result = run_command(command, 300)
    measured = last_line_json(result["stdout"]) if result["ok"] else None
    if measured is None:
        return {"status": "failed", "why": result["stderr"].strip()[-600:]}
    n, seconds = measured["replicas"], statistics.median(measured["seconds"])
    size = mib * 2**20
    return {
        "status": "passed" if measured["value_correct"] else "failed",
        "why": None if measured["value_correct"] else "the all-reduce gave a wrong sum",
        "implementation": "ReductionToOneDevice (rehearsal)" if rehearse else "NCCL",
        "replicas": n,
        "bytes": size,
        "median_seconds": seconds,
        "algorithm_bandwidth_gb_s": size / seconds / 1e9,
        "bus_bandwidth_gb_s": 2 * (n - 1) / n * size / seconds / 1e9,
        "method": "median of 10 chained all-reduces (sum, then / n), each waited for",
    }


def check_energy(train_fp16: dict, rehearse: bool) -> dict:
    if train_fp16.get("status") != "passed":
        return {"status": "not run", "why": "the fp16 run did not finish"}
    energy = train_fp16["energy"]
    gpu_sources = [s for s in energy.get("sources", []) if s.get("part") == "GPU board"]
    if not gpu_sources:
        status = "not run" if rehearse else "failed"
        return {"status": status, "why": energy.get("reason") or "no GPU energy source"}
    moving = all((s.get("joules") or 0) > 0 for s in gpu_sources)
    return {
        "status": "passed" if moving else "failed",
        "why": None if moving else "a GPU's NVML energy did not move during the run",
        "sources": gpu_sources,
        "joules": energy.get("joules"),
    }


def check_roofline(rehearse: bool, work: Path) -> dict:
    out = work / "roofline"
    command = [*CLI, "roofline", "--quick", "--no-workload", "--out", str(out)]
    if rehearse:
        command += ["--dtypes", "fp32"]
    result = run_command(command, 300)
    path = out / "roofline.json"
    if not result["ok"] or not path.exists():
        return {"status": "failed", "why": result["stderr"].strip()[-600:]}
    roofline = json.loads(path.read_text())
    keep = ("gemm_ceiling", "conv_ceiling", "theoretical_peak", "theoretical_peak_method")
    return {
        "status": "passed",
        "seconds": result["seconds"],
        "bandwidth_ceiling_bytes_per_s": roofline["bandwidth_ceiling"],
        "dtypes": {
            dtype: {key: values.get(key) for key in keep}
            for dtype, values in roofline["dtypes"].items()
        },
        "skipped": roofline["skipped"],
    }


def main() -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_check.json", help="the JSON summary")
    parser.add_argument("--steps", type=int, default=30, help="timed train steps per precision")
    parser.add_argument("--batch", type=int, default=256, help="batch per GPU at 224x224")
    parser.add_argument("--rehearse-on-cpu", action="store_true")
    args = parser.parse_args()
    keep_tensorflow_quiet()  # inherited by each check's process (their stderr tails are kept)
    out = Path(args.out)
    if out.exists():
        print(f"gpu_check: {out} exists; choose another --out", file=sys.stderr)
        return 2
    rehearse = args.rehearse_on_cpu
    started = time.time()
    checks: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="hpcai500-gpu-check-") as scratch:
        work = Path(scratch)
        checks["devices"] = check_devices(rehearse)
        gpus = len((checks["devices"].get("tensorflow") or {}).get("gpus", []))
        if checks["devices"]["status"] != "passed":
            why = "no usable GPU (see devices)"
            for name in ("train_fp16", "train_bf16", "all_reduce", "energy", "roofline"):
                checks[name] = {"status": "not run", "why": why}
        else:
            for precision in ("fp16", "bf16"):
                checks[f"train_{precision}"] = check_train(
                    precision, rehearse, args.steps, args.batch, work
                )
            checks["all_reduce"] = check_all_reduce(rehearse, gpus)
            checks["energy"] = check_energy(checks["train_fp16"], rehearse)
            checks["roofline"] = check_roofline(rehearse, work)
    for check in checks.values():  # the run directories were scratch
        check.pop("record", None)
    passed = all(c["status"] == "passed" for c in checks.values())
    summary = {
        "kind": "hpcai500-tf gpu check",
        "rehearsal_on_cpu": rehearse,
        "host": platform.node(),
        "started": started,
        "seconds": round(time.time() - started, 1),
        "passed": passed,
        "checks": checks,
    }
    out.write_text(json.dumps(summary, indent=1) + "\n")
    for name, check in checks.items():
        why = f": {check['why']}" if check.get("why") else ""
        print(f"{name:11s} {check['status']}{why}".splitlines()[0][:200])
    print(f"summary: {out}")
    if not passed:
        failed = [n for n, c in checks.items() if c["status"] != "passed"]
        print(f"gpu_check: not every check passed ({', '.join(failed)})", file=sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
