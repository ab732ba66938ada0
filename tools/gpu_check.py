"""The checks that need a GPU node, in one go, with one JSON summary (`tools/gpu_check.sh`).

    python tools/gpu_check.py [--out gpu_check.json] [--steps 200] [--batch 256]
    python tools/gpu_check.py --rehearse-on-cpu --out rehearsal.json   # the harness on a CPU
    bash tools/gpu_check.sh --install [...]   # first into its own venv with the cuda extra

Checks, each in its own process, under one deadline (--deadline, 600 s): each check gets its
share of the time that is left. The summary is rewritten after every check, so a run that is
killed or reaches the deadline leaves the checks done so far and names those it did not run.
  devices      the GPUs this process may use (nvidia-smi's, narrowed by CUDA_VISIBLE_DEVICES) and
               the ones TensorFlow sees (with compute capability);
               its first GPU kernels start CUDA's compile cache (below)
  train_fp16   ResNet-50 v1.5 at 224x224, random data, mixed fp16 with loss scaling, one GPU:
               examples/s of the timed steps (200 by default, after the run's warm-up step)
  train_bf16   the same in bfloat16 (refused by the project on GPUs without bf16)
  all_reduce   all-reduce of a 256 MiB float32 tensor by MultiWorkerMirroredStrategy's NCCL
               collective, one worker process per GPU as `train --workers N` runs them, in
               both ways of keeping a worker to its GPU (half the check's time each): every
               GPU visible and the worker's own by tf.config.set_visible_devices
               (HPCAI500_WORKER_GPUS, the default), and only its own by CUDA_VISIBLE_DEVICES;
               for each, median seconds, algorithm bandwidth (bytes / s) and bus bandwidth
               (x 2 (n - 1) / n), as nccl-tests defines them, and with NCCL_DEBUG=INFO (set
               unless you set it) the transports NCCL chose between the workers (P2P over
               NVLink/PCIe, SHM, NET); `p2p` says which placement kept P2P
  with --compare-settings (after train_bf16; give it a longer --deadline, e.g. 1200):
  train_fp16_xla    the fp16 run with `training.xla=true`
  node_one_process  the fp16 run on every GPU of the node in one process (MirroredStrategy)
  node_workers      the same with `train --workers N`, one process per GPU
  defaults     from those runs: for XLA and for the node's processes, the faster setting, its
               speed-up over the other and the train option that applies it (docs/gpu.md)
  energy       the NVML energy of the GPU the fp16 run used, from that run's record: moving
               (more than 0 J) or not
  roofline     `hpcai500-tf roofline --quick`: the measured ceilings per dtype

CUDA's compile cache: Hopper-class GPUs compile TensorFlow's kernels from PTX on first use.
The cache is sized to 4 GiB unless CUDA_CACHE_MAXSIZE is set, and its location and size before
and after are in the summary: a second run of the check finds it warm. Where a training check
was cut by the deadline while the cache grew, the summary's `cold_jit` (also printed) says
"cold JIT: rerun".

`--rehearse-on-cpu` runs the same harness on a CPU-only machine (tiny preset, 2 CPU worker
processes reducing over gRPC instead of NCCL) so that the harness itself is tested; its summary
says it is a rehearsal and proves nothing about a GPU. Exit status 0 when every check passed,
1 otherwise (the summary says which and why).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from hpcai500_tf.cluster.devices import (
    GPU_PLACEMENT,
    PLACEMENTS,
    WORKER_GPUS,
    cuda_visible_entries,
    gpu_selection,
)
from hpcai500_tf.cluster.local_workers import free_ports, tf_configs, worker_environments
from hpcai500_tf.errors import ArgumentParser
from hpcai500_tf.tensorflow_import import keep_tensorflow_quiet

CLI = [sys.executable, "-m", "hpcai500_tf.cli"]
ALL_REDUCE_MIB = 256

# A worker as `train` runs one: the project's make_strategy (TF_CONFIG's cluster, this
# worker's share of the GPUs given to TensorFlow before the strategy is built, the collective).
ALL_REDUCE_SCRIPT = """
import json, statistics, sys, time
from hpcai500_tf.tensorflow_import import import_tensorflow
import_tensorflow()
import tensorflow as tf
from hpcai500_tf.config import CommunicationConfig
from hpcai500_tf.engine.strategy import make_strategy
mib, repeats, nccl = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
strategy = make_strategy("multi_worker", CommunicationConfig("nccl" if nccl else "ring", 0.0, 0.0))
n = strategy.num_replicas_in_sync
elements, chain = mib * 2**20 // 4, 5

@tf.function
def chained():
    def step():
        context = tf.distribute.get_replica_context()
        x = tf.fill([elements], tf.cast(context.replica_id_in_sync_group + 1, tf.float32))
        for _ in range(chain):  # each takes the last one's result: none merged or skipped
            x = context.all_reduce("sum", x) / n
        return x[0]
    return strategy.experimental_local_results(strategy.run(step))[0]

chained()  # trace, and the collectives' communicators set up
seconds = []
for _ in range(repeats):
    start = time.perf_counter()
    got = float(chained())  # waits for the result
    seconds.append((time.perf_counter() - start) / chain)
print(json.dumps({"replicas": n, "seconds": seconds, "chain": chain,
                  "value_correct": abs(got - (n + 1) / 2) < 1e-3 * n,
                  "gpu_assignment": getattr(strategy, "hpcai500_gpu_assignment", None),
                  "cuda_gpus": len(tf.config.list_physical_devices("GPU")),
                  "tensorflow_gpus": len(tf.config.get_visible_devices("GPU"))}), flush=True)
"""

# NCCL's own report (NCCL_DEBUG=INFO, on stdout unless NCCL_DEBUG_FILE says otherwise) of the
# transport of each connection between ranks, e.g. "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC"
# ("Ring 00 : ..." in older NCCL; P2P/CUMEM/read, SHM/direct/direct, NET/IB/0 in newer).
NCCL_TRANSPORT = re.compile(r"NCCL INFO .*->.* via (\S+)")
NCCL_VERSION = re.compile(r"NCCL INFO NCCL version (\S+)")
# What else NCCL says about P2P or CUDA IPC (P2P refused between two GPUs, an IPC handle that
# failed, the P2P level set), and its warnings.
NCCL_NOTE = re.compile(r"NCCL (WARN .*|INFO .*(?:P2P|[Ii][Pp][Cc]).*)")

DEVICES_SCRIPT = """
import json
from hpcai500_tf.tensorflow_import import import_tensorflow
import_tensorflow()
import tensorflow as tf
gpus = tf.config.list_physical_devices("GPU")
details = [tf.config.experimental.get_device_details(g) for g in gpus]
if gpus:  # the first kernels: CUDA compiles them from PTX where the build has no SASS
    with tf.device("/GPU:0"):
        x = tf.random.normal([8, 32, 32, 16])
        float(tf.reduce_sum(tf.nn.conv2d(x, tf.ones([3, 3, 16, 16]), 1, "SAME")))
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


def check_devices(rehearse: bool, seconds: float) -> dict:
    listed, why_none = nvidia_smi_gpus()
    seen = run_command([sys.executable, "-c", DEVICES_SCRIPT], seconds)
    tensorflow = last_line_json(seen["stdout"]) if seen["ok"] else None
    result = {"nvidia_smi": listed, "tensorflow": tensorflow, "seconds": seen["seconds"]}
    if tensorflow is None:
        return {**result, "status": "failed", "why": f"TensorFlow did not start: {seen['stderr']}"}
    if rehearse:
        return {**result, "status": "passed", "why": "rehearsal: no GPU expected"}
    if why_none:
        return {**result, "status": "failed", "why": why_none}
    why = missing_gpus(len(tensorflow["gpus"]), len(listed), os.environ.get("CUDA_VISIBLE_DEVICES"))
    return {**result, "status": "failed", "why": why} if why else {**result, "status": "passed"}


def missing_gpus(seen: int, listed: int, visible: str | None) -> str | None:
    """Why TensorFlow's `seen` GPUs fall short of those this process may use: the `listed`
    ones of `nvidia-smi -L`, narrowed by CUDA_VISIBLE_DEVICES (`visible`) where it is set;
    None where they do not."""
    may_use, where = listed, f"the {listed} GPUs nvidia-smi lists"
    if visible is not None:
        may_use = min(listed, len(cuda_visible_entries(visible)))
        where = f"the {may_use} GPUs CUDA_VISIBLE_DEVICES={visible} leaves of nvidia-smi's {listed}"
    if may_use == 0:
        return f"CUDA_VISIBLE_DEVICES={visible} leaves none of nvidia-smi's {listed} GPUs: unset it"
    if seen >= may_use:
        return None
    fix = "pip install -e '.[cuda]'"
    return f"TensorFlow sees {seen} of {where}: CUDA's libraries did not load ({fix})"


def check_train(
    precision: str,
    rehearse: bool,
    steps: int,
    batch: int,
    work: Path,
    seconds: float,
    setting: Setting | None = None,
) -> dict:
    """A short throughput-only run on one device (the node's GPUs, `setting.gpus` of them, for
    a setting that asks); examples/s from its record."""
    setting = setting or Setting("", (), 1)
    out = work / f"train-{precision}{setting.name and '-' + setting.name}"
    gpus = setting.gpus
    if rehearse:
        preset = ["--preset", "tiny", "--set", "training.batch_per_replica=8"]
        examples, env = 8 * steps * gpus, {}
    else:
        preset = ["--preset", "reference", "--set", f"training.batch_per_replica={batch}"]
        examples = batch * steps * gpus
        env = {} if gpus > 1 else {"CUDA_VISIBLE_DEVICES": first_visible_gpu()}
    strategy = () if setting.workers else ("--set", "training.strategy=default")  # one GPU
    command = [
        *CLI, "train", "image_classification", *preset,
        "--set", "data.source=random", "--set", f"data.train_examples={examples}",
        "--set", "training.epochs=1", *strategy, *setting.arguments,
        "--set", "training.checkpoint_every=0", "--set", f"training.precision={precision}",
        "--no-tensorboard", "--out", str(out),
    ]  # fmt: skip
    result = run_command(command, seconds, env)
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
        "timed_steps": steps,
        "examples_per_s": record["timeline"]["epochs"][-1]["examples"] / seconds,
        "policy": record["layers"]["L7"].get("precision"),
        "loss_scaling": record["layers"]["L8"].get("loss_scaling"),
        "devices_used": record["layers"]["L5"].get("devices_used"),
        "energy": record["energy"],
    }


class Setting(NamedTuple):
    """A way of running the fp16 step that the check times against another: its name, the
    train command's extra arguments, and the GPUs it trains on."""

    name: str
    arguments: tuple[str, ...]
    gpus: int

    @property
    def workers(self) -> bool:
        """Whether it chooses its own strategy (`--workers N`, or one named)."""
        return any(a == "--workers" or a.startswith("training.strategy=") for a in self.arguments)


XLA_ON = Setting("xla", ("--set", "training.xla=true"), 1)


def node_settings(gpus: int) -> dict[str, Setting]:
    """The node's GPUs driven by one process (MirroredStrategy) or one process per GPU."""
    return {
        "node_one_process": Setting("one-process", ("--set", "training.strategy=mirrored"), gpus),
        "node_workers": Setting("workers", ("--workers", str(gpus)), gpus),
    }


def faster_settings(checks: dict, gpus: int) -> dict:
    """For XLA, and for one process against `--workers N` on the node, the faster of the two
    settings the checks timed (examples/s of the fp16 step), its speed-up over the other and
    the train option that applies it; "not run" where either side has no rate."""
    pairs = {
        "xla": (
            ("off", "train_fp16", "--set training.xla=false"),
            ("on", "train_fp16_xla", "--set training.xla=true"),
        ),
        "node": (
            ("one process", "node_one_process", "--set training.strategy=mirrored"),
            (f"--workers {gpus}", "node_workers", f"--workers {gpus}"),
        ),
    }
    choices = {}
    for what, sides in pairs.items():
        rates = {label: checks.get(name, {}).get("examples_per_s") for label, name, _ in sides}
        if any(not rate for rate in rates.values()):
            missing = [name for label, name, _ in sides if not rates[label]]
            choices[what] = {"status": "not run", "why": f"no rate from {', '.join(missing)}"}
            continue
        slower, faster = sorted(sides, key=lambda side: rates[side[0]])
        choices[what] = {
            "status": "passed",
            "faster": faster[0],
            "apply": faster[2],
            "speedup": rates[faster[0]] / rates[slower[0]],
            "examples_per_s": rates,
        }
    status = "passed" if all(c["status"] == "passed" for c in choices.values()) else "not run"
    return {"status": status, **choices}


def first_visible_gpu() -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[0] if visible else "0"


def all_reduce_environments(
    placement: str, gpus: list[str], ports: list[int], base_env: dict
) -> list[dict[str, str]]:
    """Each all-reduce worker's environment, as `train --workers N` builds it
    (local_workers.worker_environments): TF_CONFIG on loopback and its share of the cores; on GPUs
    (`gpus`, CUDA_VISIBLE_DEVICES entries, one per port) one GPU each, kept to it by
    `placement` (HPCAI500_GPU_PLACEMENT: set_visible_devices, its position in
    HPCAI500_WORKER_GPUS with CUDA_VISIBLE_DEVICES left as it was; or cuda_visible_devices,
    its own CUDA_VISIBLE_DEVICES), and NCCL_DEBUG=INFO unless it is set. A share set by hand
    is not passed on: the check splits every GPU TensorFlow saw."""
    base = {name: value for name, value in base_env.items() if name != WORKER_GPUS}
    if gpus:
        base[GPU_PLACEMENT] = placement
        base.setdefault("NCCL_DEBUG", "INFO")
    environments = worker_environments(len(ports), gpus, base)
    for env, tf_config in zip(environments, tf_configs(ports), strict=True):
        env["TF_CONFIG"] = tf_config
    return environments


def nccl_log(outputs: list[str]) -> dict:
    """What NCCL_DEBUG=INFO output (each worker's stdout and stderr) says: the transport of
    every connection it reported, counted by name ("P2P/IPC", "SHM/direct/direct", ...), its
    version, and up to 8 distinct other lines about P2P or CUDA IPC, or warnings."""
    transports: dict[str, int] = {}
    version, notes = None, []
    for line in (line for text in outputs for line in text.splitlines()):
        if match := NCCL_TRANSPORT.search(line):
            transports[match.group(1)] = transports.get(match.group(1), 0) + 1
        elif match := NCCL_VERSION.search(line):
            version = version or match.group(1)
        elif (match := NCCL_NOTE.search(line)) and len(notes) < 8:
            note = match.group(1).strip()[:200]
            if note not in notes:
                notes.append(note)
    return {"transports": dict(sorted(transports.items())), "version": version, "notes": notes}


def uses_p2p(transports: dict[str, int]) -> bool:
    return any(name.split("/")[0] == "P2P" for name in transports)


def p2p_verdict(placements: dict[str, dict]) -> str:
    """One line saying which placement NCCL took P2P in, with each one's transports and bus
    bandwidth: what the first run on a GPU node settles."""
    seen = {
        name: result["nccl_transports"]
        for name, result in placements.items()
        if isinstance(result.get("nccl_transports"), dict) and result["nccl_transports"]
    }
    if not seen:
        return (
            "not seen: no NCCL_DEBUG=INFO connection lines (a rehearsal, NCCL_DEBUG set "
            "otherwise, or its output sent elsewhere by NCCL_DEBUG_FILE)"
        )
    with_p2p = [name for name, transports in seen.items() if uses_p2p(transports)]
    if not with_p2p:
        lead = "no P2P with " + " or ".join(seen)
    elif len(with_p2p) == len(placements):
        lead = "P2P with " + " and ".join(with_p2p)
    else:
        lead = f"P2P with {' and '.join(with_p2p)} only"
    parts = []
    for name, result in placements.items():
        transports = ", ".join(seen.get(name, {})) or result.get("status", "not run")
        bandwidth = result.get("bus_bandwidth_gb_s")
        gb_s = f", bus {bandwidth:.1f} GB/s" if bandwidth is not None else ""
        parts.append(f"{name}: {transports}{gb_s}")
    return f"{lead} ({'; '.join(parts)})"


def time_placement(
    placement: str, rehearse: bool, gpus: list[str], workers: int, mib: int, seconds: float
) -> dict:
    """The all-reduce timed once with one worker process per GPU kept to it by `placement`
    (2 CPU workers reducing over gRPC in the rehearsal), all ended by `seconds`."""
    command = [sys.executable, "-c", ALL_REDUCE_SCRIPT, str(mib), "10", "0" if rehearse else "1"]
    ports = free_ports(workers)
    environments = all_reduce_environments(placement, [] if rehearse else gpus, ports, os.environ)
    start = time.monotonic()
    results = run_together(command, environments, seconds)
    nccl = nccl_log([r["stdout"] + "\n" + r["stderr_all"] for r in results])
    facts = {
        "seconds": round(time.monotonic() - start, 2),
        "worker_gpus": None if rehearse else [gpu_selection(env) for env in environments],
        "nccl_version": nccl["version"],
        "nccl_transports": nccl["transports"]
        or "not seen (NCCL_DEBUG=INFO output absent: a rehearsal, or NCCL_DEBUG set otherwise)",
    }
    if nccl["notes"]:
        facts["nccl_p2p_notes"] = nccl["notes"]
    measured = last_line_json(results[0]["stdout"]) if all(r["ok"] for r in results) else None
    if measured is None or "seconds" not in measured:
        failed = next((r for r in results if not r["ok"]), results[0])
        return {"status": "failed", "why": failed["stderr"].strip()[-600:], **facts}
    n, median = measured["replicas"], statistics.median(measured["seconds"])
    size = mib * 2**20
    return {
        "status": "passed" if measured["value_correct"] else "failed",
        "why": None if measured["value_correct"] else "the all-reduce gave a wrong sum",
        "gpu_assignment": measured.get("gpu_assignment"),  # worker 0's, as L3 records it
        "cuda_gpus_per_worker": measured.get("cuda_gpus"),
        "tensorflow_gpus_per_worker": measured.get("tensorflow_gpus"),
        "replicas": n,
        "median_seconds": median,
        "algorithm_bandwidth_gb_s": size / median / 1e9,
        "bus_bandwidth_gb_s": 2 * (n - 1) / n * size / median / 1e9,
        "chain": measured["chain"],
        **facts,
    }


def check_all_reduce(rehearse: bool, gpus: list[str], seconds: float) -> dict:
    """One worker process per GPU (2 CPU workers in the rehearsal), joined by TF_CONFIG on
    loopback as `train --workers N` joins them, timed in each placement (PLACEMENTS, the
    project's default first; MIG instances in cuda_visible_devices only, as `--workers N`
    places them), each given an equal part of what is left of `seconds` (all of it where a
    part would be under 5 s). The top-level figures are the first placement's."""
    workers = 2 if rehearse else len(gpus)
    if workers < 2:
        return {"status": "not run", "why": f"{workers} GPU(s): an all-reduce needs two"}
    mib = 4 if rehearse else ALL_REDUCE_MIB
    mig = not rehearse and any(entry.startswith("MIG-") for entry in gpus)
    order = PLACEMENTS[1:] if mig else PLACEMENTS
    end = time.monotonic() + seconds
    placements: dict[str, dict] = {}
    for done, placement in enumerate(order):
        left = end - time.monotonic()
        budget = left / (len(order) - done)
        if budget < 5:  # too little for each: all of it to this one (the default first)
            budget = left
        if budget < 5:
            placements[placement] = {"status": "not run", "why": "the check's time was spent"}
            continue
        placements[placement] = time_placement(placement, rehearse, gpus, workers, mib, budget)
    first = placements[order[0]]
    problems = [
        f"{name}: {result['why']}"
        for name, result in placements.items()
        if result["status"] != "passed" and result.get("why")
    ]
    passed = all(result["status"] in ("passed", "not run") for result in placements.values())
    summary = {
        "status": "passed" if passed and first["status"] == "passed" else "failed",
        "why": "; ".join(problems) or None,
        "implementation": "MultiWorkerMirroredStrategy, "
        + ("RING over gRPC (rehearsal)" if rehearse else "NCCL"),
        "workers": workers,
        "bytes": mib * 2**20,
        "default_placement": order[0],
        "method": "per placement, median over 10 calls of a chain of dependent all-reduces "
        "(sum, then / n) each, timed on worker 0 and waited for, per all-reduce; bandwidths "
        "as nccl-tests defines them (bus = algorithm x 2 (n - 1) / n)",
    }
    keep = ("replicas", "median_seconds", "algorithm_bandwidth_gb_s", "bus_bandwidth_gb_s",
            "nccl_transports")  # fmt: skip
    summary |= {key: first[key] for key in keep if key in first}
    return {**summary, "p2p": p2p_verdict(placements), "placements": placements}


def run_together(command: list[str], environments: list[dict], seconds: float) -> list[dict]:
    """Run one process per environment at once, all ended by `seconds`: each one's {ok, code,
    stdout, stderr tail, stderr_all}. Their output goes to files, not pipes: a worker blocked
    on a full pipe (NCCL_DEBUG=INFO writes much) would stall the collective of them all."""
    with contextlib.ExitStack() as files:
        outputs = [
            (files.enter_context(tempfile.TemporaryFile("w+")),
             files.enter_context(tempfile.TemporaryFile("w+")))
            for _ in environments
        ]  # fmt: skip
        processes = [
            subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr, text=True)
            for env, (stdout, stderr) in zip(environments, outputs, strict=True)
        ]
        deadline = time.monotonic() + seconds
        results = []
        for process, (stdout, stderr) in zip(processes, outputs, strict=True):
            try:
                code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
                late = ""
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                code, late = None, f"\ndid not finish within {seconds:g} s"
            stdout.seek(0)
            stderr.seek(0)
            errors = stderr.read() + late
            results.append({"ok": code == 0, "code": code, "stdout": stdout.read(),
                            "stderr": errors[-1500:], "stderr_all": errors})  # fmt: skip
    return results


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


def check_roofline(rehearse: bool, work: Path, seconds: float) -> dict:
    out = work / "roofline"
    command = [*CLI, "roofline", "--quick", "--no-workload", "--out", str(out)]
    if rehearse:
        command += ["--dtypes", "fp32"]
    result = run_command(command, seconds)
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


# Each check's share of the time left when it starts (energy is read from the fp16 run's record).
# all_reduce runs twice, once per placement (its worker processes' start-up each time).
SHARES = {"devices": 1, "train_fp16": 3, "train_bf16": 3, "all_reduce": 2.5, "energy": 0,
          "roofline": 2}  # fmt: skip
CHECKS = tuple(SHARES)
# With --compare-settings, after train_bf16: the fp16 step with XLA, the node's GPUs in one
# process and one process per GPU, and the faster of each pair (`defaults`).
SETTING_SHARES = {"train_fp16_xla": 3, "node_one_process": 3, "node_workers": 3, "defaults": 0}
SHARES |= SETTING_SHARES


def checks_asked(compare_settings: bool) -> tuple[str, ...]:
    """The checks a run makes, in order."""
    if not compare_settings:
        return CHECKS
    at = CHECKS.index("train_bf16") + 1
    return (*CHECKS[:at], *SETTING_SHARES, *CHECKS[at:])


# how a check cut by the deadline says so (run_command's timeout; run_checks, no time left)
CUT_BY_DEADLINE = ("did not finish within", "deadline was reached")
CACHE_BYTES = 4 * 2**30  # CUDA_CACHE_MAXSIZE: ResNet-50's kernels in fp16, bf16 and fp32


def gpu_entries(count: int) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries of the GPUs TensorFlow saw: that variable's, else 0..n-1."""
    listed = [e for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    return (listed or [str(i) for i in range(count)])[:count]


def cuda_cache() -> dict:
    """Where CUDA keeps its compiled kernels (CUDA_CACHE_PATH, else its default), its size
    limit and what it holds now."""
    path = Path(os.environ.get("CUDA_CACHE_PATH") or Path.home() / ".nv" / "ComputeCache")
    held = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0
    return {"path": str(path), "max_bytes": int(os.environ["CUDA_CACHE_MAXSIZE"]), "bytes": held}


def cold_jit(checks: dict, before: dict, after: dict) -> str | None:
    """ "cold JIT: rerun" where a training check was cut by the deadline while CUDA's compile
    cache grew: it was compiling TensorFlow's kernels from PTX (Hopper-class GPUs, first use),
    which a second run finds cached."""
    cut = [
        name
        for name in ("train_fp16", "train_bf16")
        if any(why in checks.get(name, {}).get("why", "") for why in CUT_BY_DEADLINE)
    ]
    grew = after["bytes"] - before["bytes"]
    if not cut or grew <= 0:
        return None
    return (
        f"cold JIT: rerun: {' and '.join(cut)} cut by the deadline while CUDA compiled "
        f"TensorFlow's kernels into its cache ({after['path']}, {grew / 2**20:.0f} MiB more); "
        "a second run finds them there"
    )


def write_summary(out: Path, summary: dict) -> None:
    """Replace the summary whole (a temporary file renamed over it): never half a file."""
    checks = summary["checks"]
    asked = summary.get("asked", CHECKS)
    summary["passed"] = all(checks.get(n, {}).get("status") == "passed" for n in asked)
    summary["unfinished"] = [n for n in asked if n not in checks]
    summary["seconds"] = round(time.time() - summary["started"], 1)
    temporary = out.with_name(f".{out.name}.tmp")
    temporary.write_text(json.dumps(summary, indent=1) + "\n")
    os.replace(temporary, out)


def run_checks(summary: dict, out: Path, args, deadline: float, work: Path) -> None:
    """Each check in turn with its share of the time left, the summary rewritten after each."""
    checks, rehearse = summary["checks"], args.rehearse_on_cpu
    sizes, asked = (args.steps, args.batch), summary.get("asked", CHECKS)

    def gpus() -> int:  # those TensorFlow sees (2 CPU workers in the rehearsal)
        return 2 if rehearse else len((checks["devices"].get("tensorflow") or {}).get("gpus", []))

    def share(name: str) -> float:
        left = deadline - time.monotonic()
        weight = SHARES[name] / sum(SHARES[n] for n in asked if n not in checks)
        return left * weight

    def record(name: str, result: dict) -> None:
        if name != "train_fp16":  # its run directory is scratch; the energy check reads fp16's
            result.pop("record", None)
        checks[name] = result
        write_summary(out, summary)

    for name in asked:
        if name in checks:
            continue
        seconds = share(name) if SHARES[name] else 0.0
        if SHARES[name] and seconds < 5:
            record(
                name, {"status": "not run", "why": f"the {args.deadline:g} s deadline was reached"}
            )
            continue
        if name == "devices":
            record(name, check_devices(rehearse, seconds))
            if checks["devices"]["status"] != "passed":
                for other in asked[1:]:
                    checks[other] = {"status": "not run", "why": "no usable GPU (see devices)"}
                write_summary(out, summary)
                return
        elif name == "train_fp16_xla":
            record(name, check_train("fp16", rehearse, *sizes, work, seconds, XLA_ON))
        elif name.startswith("train_"):
            precision = name.removeprefix("train_")
            run = check_train(precision, rehearse, args.steps, args.batch, work, seconds)
            record(name, run)
        elif name.startswith("node_"):
            if gpus() < 2:
                record(name, {"status": "not run", "why": f"{gpus()} GPU(s): one process each"})
                continue
            setting = node_settings(gpus())[name]
            record(name, check_train("fp16", rehearse, *sizes, work, seconds, setting))
        elif name == "defaults":
            record(name, faster_settings(checks, gpus()))
        elif name == "all_reduce":
            count = len((checks["devices"].get("tensorflow") or {}).get("gpus", []))
            record(name, check_all_reduce(rehearse, gpu_entries(count), seconds))
        elif name == "energy":
            record(name, check_energy(checks["train_fp16"], rehearse))
            checks["train_fp16"].pop("record", None)  # a scratch run directory
        elif name == "roofline":
            record(name, check_roofline(rehearse, work, seconds))


def main() -> int:
    # no abbreviations: gpu_check.sh reads --deadline to set the outer limit
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--out", default="gpu_check.json", help="the JSON summary")
    parser.add_argument("--steps", type=int, default=200, help="timed train steps per precision")
    parser.add_argument("--batch", type=int, default=256, help="batch per GPU at 224x224")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds for every check")
    parser.add_argument("--rehearse-on-cpu", action="store_true")
    parser.add_argument(
        "--compare-settings",
        action="store_true",
        help="also time the fp16 step with XLA and the node's GPUs in one process against "
        "--workers N, and name the faster of each (give it a longer --deadline, e.g. 1200)",
    )
    args = parser.parse_args()
    keep_tensorflow_quiet()  # inherited by each check's process (their stderr tails are kept)
    out = Path(args.out)
    if out.exists():
        print(f"gpu_check: {out} exists; choose another --out", file=sys.stderr)
        return 2
    if not (args.steps >= 1 and args.batch >= 1 and 0 < args.deadline <= 86_400):
        print("gpu_check: error: need --steps >= 1, --batch >= 1, 0 < --deadline <= 86400",
              file=sys.stderr)  # fmt: skip
        return 2
    os.environ.setdefault("CUDA_CACHE_MAXSIZE", str(CACHE_BYTES))
    deadline = time.monotonic() + args.deadline
    summary = {
        "kind": "hpcai500-tf gpu check",
        "rehearsal_on_cpu": args.rehearse_on_cpu,
        "host": platform.node(),
        "started": time.time(),
        "deadline_s": args.deadline,
        "asked": list(checks_asked(args.compare_settings)),
        "cuda_cache_before": cuda_cache(),
        "checks": {},
    }
    write_summary(out, summary)  # from now on the file always holds the checks done so far
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # an outer timeout: keep the file
    try:
        with tempfile.TemporaryDirectory(prefix="hpcai500-gpu-check-") as scratch:
            run_checks(summary, out, args, deadline, Path(scratch))
    finally:
        summary["cuda_cache_after"] = cuda_cache()
        before, after = summary["cuda_cache_before"], summary["cuda_cache_after"]
        summary["cold_jit"] = cold_jit(summary["checks"], before, after)
        summary["checks"].get("train_fp16", {}).pop("record", None)
        write_summary(out, summary)
    checks = summary["checks"]
    for name, check in checks.items():
        why = f": {check['why']}" if check.get("why") else ""
        print(f"{name:11s} {check['status']}{why}".splitlines()[0][:200])
    if summary["cold_jit"]:
        print(summary["cold_jit"])
    print(f"summary: {out}")
    if not summary["passed"]:
        failed = [n for n in summary["asked"] if checks.get(n, {}).get("status") != "passed"]
        print(f"gpu_check: not every check passed ({', '.join(failed)})", file=sys.stderr)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
