"""import-mlperf of a results tree the size of an MLPerf round, then rank and report over it.

Makes a tree in MLPerf's layout (SUBMITTERS x SYSTEMS x 5 ResNet result files, about 150 KB
each: MLLOG lines of the shape NVIDIA's logs have, weights_initialization and tracked_stats
among them, one run that aborts, the step lines of 8 ranks between them), then times, each as
the command a user runs (a fresh process):

    hpcai500-tf import-mlperf TREE --out RECORDS            (target: under 60 s)
    hpcai500-tf rank RECORDS/*.json --convention published-2020 --json
    hpcai500-tf report RECORDS/*.json --out PAGES           (with rank: under 30 s)

    python benchmarks/mlperf_tree_scale.py [--submitters 8] [--systems 5] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS_PER_SYSTEM = 5
RANKS = 8
TENSORS = 161  # weights_initialization lines of an MXNet ResNet-50 log
IMAGENET = 1_281_167


def line(time_ms: int, key: str, value=None, event="POINT_IN_TIME", **metadata) -> str:
    """One :::MLLOG line as mllog writes it."""
    metadata = {"file": "/workspace/image_classification/train.py", "lineno": 100, **metadata}
    event = {"namespace": "", "time_ms": time_ms, "event_type": event, "key": key,
             "value": value, "metadata": metadata}  # fmt: skip
    return ":::MLLOG " + json.dumps(event)


def result_log(org: str, start: int, epochs: int, epoch_ms: int, seed: int, aborted: bool) -> str:
    """A ResNet run's console output (see the module's doc)."""
    t = start
    out = [line(t, "submission_benchmark", "resnet"), line(t, "submission_org", org),
           line(t, "submission_division", "closed"), line(t, "submission_status", "onprem"),
           line(t, "submission_platform", f"{org} cluster"), line(t + 1, "cache_clear", True),
           line(t + 2, "init_start", event="INTERVAL_START"),
           line(t + 3, "seed", seed)]  # fmt: skip
    out += [line(t + 4, "weights_initialization", tensor=f"stage{i // 10}_unit{i}_weight")
            for i in range(TENSORS)]  # fmt: skip
    for key, value in (("global_batch_size", 3264), ("gradient_accumulation_steps", 1),
                       ("opt_name", "lars"), ("lars_opt_base_learning_rate", 10.5),
                       ("lars_opt_end_learning_rate", 0.0001), ("lars_epsilon", 0.0),
                       ("lars_opt_learning_rate_decay_poly_power", 2),
                       ("lars_opt_learning_rate_decay_steps", epochs),
                       ("lars_opt_learning_rate_warmup_epochs", 2), ("lars_opt_momentum", 0.9),
                       ("lars_opt_weight_decay", 0.0002)):  # fmt: skip
        out.append(line(t + 5, key, value))
    t += 60_000
    out += [line(t, "init_stop", event="INTERVAL_END"),
            line(t, "run_start", event="INTERVAL_START"),
            line(t, "train_samples", IMAGENET), line(t, "eval_samples", 50_000)]  # fmt: skip
    final = 0.62 if aborted else 0.7601
    for epoch in range(1, epochs + 1):
        out.append(line(t, "epoch_start", event="INTERVAL_START", epoch_num=epoch))
        for step in range(0, 392, 80):  # every rank's progress, between the MLLOG lines
            out += [f"{rank}: epoch {epoch} step {step}/392 loss {2.5 - epoch / 30:.3f} "
                    f"lr {10.5 * epoch / epochs:.4f} {3264 / 0.3:.1f} img/s"
                    for rank in range(RANKS)]  # fmt: skip
        t += epoch_ms
        out.append(line(t, "epoch_stop", event="INTERVAL_END", epoch_num=epoch))
        out.append(line(t, "tracked_stats", {"throughput": IMAGENET / epoch_ms * 1000}, step=epoch))
        if epoch % 4 == epochs % 4:
            out.append(line(t, "eval_start", event="INTERVAL_START", epoch_num=epoch))
            t += epoch_ms // 10
            out.append(line(t, "eval_stop", event="INTERVAL_END", epoch_num=epoch))
            accuracy = round(final * (1 - 0.8 * (1 - epoch / epochs) ** 2), 5)
            out.append(line(t, "eval_accuracy", accuracy, epoch_num=epoch))
    status = "aborted" if aborted else "success"
    out.append(line(t + 5, "run_stop", event="INTERVAL_END", status=status, epoch_num=epochs))
    return "\n".join(out) + "\n"


def description(org: str, system: str, nodes: int) -> dict:
    """A system description with the fields mlperf-logging's checker asks for."""
    fields = dict.fromkeys(
        ["host_processor_vcpu_count", "host_processor_frequency", "host_processor_caches",
         "host_processor_interconnect", "host_networking_topology", "host_memory_configuration",
         "accelerator_host_interconnect", "accelerator_frequency", "accelerator_on-chip_memories",
         "accelerator_interconnect_topology", "cooling", "hw_notes", "sw_notes"], "")  # fmt: skip
    return fields | {
        "submitter": org, "division": "closed", "status": "Available on-premise",
        "system_name": system, "number_of_nodes": str(nodes), "host_processors_per_node": "2",
        "host_processor_model_name": "Intel(R) Xeon(R) Platinum 8480C",
        "host_processor_core_count": "56", "host_memory_capacity": "2 TB",
        "host_storage_type": "NVMe SSD", "host_storage_capacity": "4x 3.84 TB",
        "host_networking": "8x ConnectX-7 IB NDR 400 Gb/s", "accelerators_per_node": "8",
        "accelerator_model_name": "NVIDIA H100-SXM5-80GB", "accelerator_memory_capacity": "80 GB",
        "accelerator_memory_configuration": "HBM3", "accelerator_interconnect": "NVLink 900 GB/s",
        "framework": "MxNet NVIDIA Release 24.04", "operating_system": "Ubuntu 22.04.4 LTS",
        "other_software_stack": {"cuda_version": "12.4.1", "cudnn_version": "9.1.0.70",
                                 "nccl_version": "2.21.5", "cuda_driver_version": "550.54.15"},
    }  # fmt: skip


def make_tree(root: Path, submitters: int, systems: int) -> tuple[int, int]:
    """The tree under root/training_results_v4.0; returns (result files, bytes of logs)."""
    files = size = 0
    for o in range(submitters):
        org = f"Submitter{o}"
        (root / org / "systems").mkdir(parents=True)
        for s in range(systems):
            system, nodes = f"{org.lower()}_n{2**s}", 2**s
            (root / org / "systems" / f"{system}.json").write_text(
                json.dumps(description(org, system, nodes), indent=2)
            )
            folder = root / org / "results" / system / "resnet"
            folder.mkdir(parents=True)
            for r in range(RESULTS_PER_SYSTEM):
                text = result_log(org, 1_700_000_000_000 + (o * 100 + s * 10 + r) * 10**7,
                                  36 + (r + s) % 5, 20_000 // nodes + 97 * r, r + 1,
                                  aborted=o == s == r == 0)  # fmt: skip
                (folder / f"result_{r}.txt").write_text(text)
                files, size = files + 1, size + len(text)
    return files, size


def cpu_name() -> str:
    try:
        listing = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for row in listing.splitlines():
            if row.startswith("Model name:"):
                return row.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return "unknown CPU"


def timed(argv: list[str]) -> tuple[float, str]:
    """Seconds a fresh hpcai500-tf process takes for `argv`, and what it printed."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hpcai500_tf.cli", *argv], capture_output=True,
                          text=True)  # fmt: skip
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:2])} failed: {done.stderr.strip()}")
    return seconds, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submitters", type=int, default=8)
    parser.add_argument("--systems", type=int, default=5, help="per submitter (5 results each)")
    parser.add_argument("--keep", type=Path, help="make the tree here and keep it")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="mlperf-tree-"))
    try:
        measure(work, args.submitters, args.systems)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


def measure(work: Path, submitters: int, systems: int) -> None:
    """Make the tree under `work`, then time the three commands over it."""
    tree = work / "training_results_v4.0"
    started = time.perf_counter()
    files, size = make_tree(tree, submitters, systems)
    made = time.perf_counter() - started
    print(f"tree: {files} result files, {size / 1e6:.1f} MB of logs, {submitters} "
          f"submitters x {systems} systems, made in {made:.1f} s")  # fmt: skip
    records = work / "records"
    seconds, printed = timed(["import-mlperf", str(tree), "--out", str(records)])
    last = printed.strip().splitlines()[-1].split(" into ")[0]
    print(f"import-mlperf: {seconds:.1f} s ({last}); target 60 s")
    paths = sorted(str(p) for p in records.glob("*.json"))
    rank_s, printed = timed(["rank", *paths, "--convention", "published-2020", "--json"])
    ranked = len(json.loads(printed)["submissions"])
    report_s, printed = timed(["report", *paths, "--out", str(work / "pages")])
    pages = len(printed.splitlines())
    print(f"rank --convention published-2020: {rank_s:.1f} s ({ranked} submissions, the nine "
          f"published among them); report: {report_s:.1f} s ({pages} pages); together "
          f"{rank_s + report_s:.1f} s; target 30 s")  # fmt: skip
    print(f"machine: {cpu_name()}, {os.cpu_count()} logical CPUs")


if __name__ == "__main__":
    main()
