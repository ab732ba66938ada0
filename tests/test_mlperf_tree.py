"""import-mlperf of an MLPerf results tree, and the ranking of what it imports.

Every tree here is made by the tests, in MLPerf's layout: logs written through mlperf-logging's
own mllog (four ranks interleaved, other console text between their lines), system
descriptions that pass mlperf-logging's system-description checker, one run that aborts and
one file that cannot be read. mlperf-logging's result_summarizer, run on the same folder, is
the reference for each system's time. Nothing is fetched."""

import copy
import csv
import json
import logging
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcai500_tf import config, record
from hpcai500_tf.cli import main
from hpcai500_tf.mlperf import analytical_flops
from hpcai500_tf.results import scoring

mllog = pytest.importorskip("mlperf_logging.mllog", reason="pip install -e '.[test]'")
from mlperf_logging.system_desc_checker.system_desc_checker import (  # noqa: E402
    check_system_desc,
)

RULESET = "4.0.0"  # the last MLPerf Training round with ResNet (mlperf-logging's rulesets)
ROUND_DIR = "training_results_v4.0"
IMAGENET = 1_281_167


# ------------------------------------------------------------------------ making trees


class _Lines(logging.Handler):
    """Collects one rank's log lines as (time_ms, rank, text)."""

    def __init__(self, lines: list, rank: int):
        super().__init__()
        self.lines, self.rank = lines, rank

    def emit(self, entry):
        text = entry.getMessage().strip()
        time_ms = json.loads(text.split(":::MLLOG ", 1)[1])["time_ms"]
        self.lines.append((time_ms, self.rank, f"{self.rank}: {text}"))


def _logger(lines: list, rank: int):
    log = logging.Logger(f"rank{rank}")
    log.addHandler(_Lines(lines, rank))
    return mllog.mllog.MLLogger(logger=log)


def _optimizer_settings(optimizer: str, epochs: int) -> dict:
    """The hyperparameter lines a ResNet log states for its optimizer ("lars" or SGD's)."""
    if optimizer == "lars":
        return {"lars_opt_base_learning_rate": 10.5, "lars_opt_end_learning_rate": 0.0001,
                "lars_opt_learning_rate_decay_poly_power": 2,
                "lars_opt_learning_rate_decay_steps": epochs, "lars_epsilon": 0.0,
                "lars_opt_learning_rate_warmup_epochs": 2, "lars_opt_momentum": 0.9,
                "lars_opt_weight_decay": 0.0002}  # fmt: skip
    return {"sgd_opt_base_learning_rate": 2.0, "sgd_opt_end_learning_rate": 0.0001,
            "sgd_opt_learning_rate_decay_poly_power": 2,
            "sgd_opt_learning_rate_decay_steps": epochs, "sgd_opt_weight_decay": 0.0001,
            "sgd_opt_momentum": 0.9, "model_bn_span": 64,
            "opt_learning_rate_warmup_epochs": 3}  # fmt: skip


def write_log(
    path: Path,
    *,
    start_ms: int,
    epochs: int,
    epoch_ms: int,
    batch: int = 3264,
    seed: int = 1,
    final: float = 0.7601,
    aborted: bool = False,
    ranks: int = 4,
    nodes: int = 1,
    org: str = "Alpha",
    optimizer: str = "lars",
    benchmark: str = "resnet",
) -> Path:
    """A ResNet run's console output: rank 0's whole MLPerf log, the other ranks' init_start,
    every rank's step lines between them (not :::MLLOG); on several nodes, every node's
    launcher logs the header (submission_*) at its own time, as multi-node MLPerf logs do."""
    lines: list = []
    loggers = [_logger(lines, rank) for rank in range(ranks)]
    zero, t = loggers[0], start_ms
    for node in range(nodes):
        launcher = _logger(lines, node * ranks // nodes)
        for key, value in (("submission_benchmark", benchmark), ("submission_org", org),
                           ("submission_division", "closed"), ("submission_status", "onprem"),
                           ("submission_platform", "2xSynthetic")):  # fmt: skip
            launcher.event(key=key, value=value, time_ms=t + 997 * node)
    zero.event(key="cache_clear", value=True, time_ms=t + 1)
    for rank, logger in enumerate(loggers):
        logger.start(key="init_start", time_ms=t + 2 + rank)
    zero.event(key="seed", value=seed, time_ms=t + 10)
    zero.event(key="global_batch_size", value=batch, time_ms=t + 11)
    zero.event(key="gradient_accumulation_steps", value=1, time_ms=t + 11)
    zero.event(key="opt_name", value=optimizer, time_ms=t + 12)
    for key, value in _optimizer_settings(optimizer, epochs).items():
        zero.event(key=key, value=value, time_ms=t + 12)
    t += 60_000
    zero.end(key="init_stop", time_ms=t)
    zero.start(key="run_start", time_ms=t)
    zero.event(key="train_samples", value=IMAGENET, time_ms=t)
    zero.event(key="eval_samples", value=50_000, time_ms=t)
    evaluated = [e for e in range(1, epochs + 1) if e % 4 == epochs % 4]
    first = 1
    for last in evaluated:
        block = {"first_epoch_num": first, "epoch_count": last - first + 1}
        zero.start(key="block_start", time_ms=t, metadata=block)
        for epoch in range(first, last + 1):
            zero.start(key="epoch_start", time_ms=t, metadata={"epoch_num": epoch})
            t += epoch_ms
            zero.end(key="epoch_stop", time_ms=t, metadata={"epoch_num": epoch})
            for rank in range(ranks):  # every rank's step output, between the MLLOG lines
                lines.append((t, rank, f"{rank}: epoch {epoch} step 392: loss 2.{rank}1, "
                                       f"{batch / 0.3:.0f} img/s"))  # fmt: skip
        zero.start(key="eval_start", time_ms=t, metadata={"epoch_num": last})
        t += epoch_ms // 10
        zero.end(key="eval_stop", time_ms=t, metadata={"epoch_num": last})
        value = final * (1 - 0.8 * (1 - last / epochs) ** 2)
        zero.event(key="eval_accuracy", value=round(value, 5), time_ms=t,
                   metadata={"epoch_num": last})  # fmt: skip
        zero.end(key="block_stop", time_ms=t, metadata={"first_epoch_num": first})
        first = last + 1
    status = "aborted" if aborted else "success"
    zero.end(key="run_stop", time_ms=t + 5, metadata={"status": status, "epoch_num": epochs})
    lines.sort(key=lambda line: (line[0], line[1]))
    text = [f"+ srun --ntasks={ranks} python train.py  # {path.name}"]
    text += [line for _, _, line in lines]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text) + "\nENDING TIMING RUN\n")
    return path


def description(
    org: str, name: str, nodes: int, per_node: int, accelerator: str, framework: str, stack
) -> dict:
    """A system description with every field mlperf-logging's checker asks for."""  # fmt: skip
    fields = {
        "submitter": org, "division": "closed", "status": "Available on-premise",
        "system_name": name, "number_of_nodes": str(nodes), "host_processors_per_node": "2",
        "host_processor_model_name": "Intel(R) Xeon(R) Platinum 8480C",
        "host_processor_core_count": "56", "host_processor_vcpu_count": "112",
        "host_processor_frequency": "", "host_processor_caches": "",
        "host_processor_interconnect": "", "host_memory_capacity": "2 TB",
        "host_storage_type": "NVMe SSD", "host_storage_capacity": "4x 3.84 TB",
        "host_networking": "8x ConnectX-7 IB NDR 400 Gb/s", "host_networking_topology": "fat tree",
        "host_memory_configuration": "", "accelerators_per_node": str(per_node),
        "accelerator_model_name": accelerator, "accelerator_host_interconnect": "PCIe 5.0",
        "accelerator_frequency": "", "accelerator_on-chip_memories": "",
        "accelerator_memory_configuration": "HBM3", "accelerator_memory_capacity": "80 GB",
        "accelerator_interconnect": "NVLink 900 GB/s", "accelerator_interconnect_topology": "",
        "cooling": "air", "hw_notes": "", "framework": framework,
        "other_software_stack": stack, "operating_system": "Ubuntu 22.04.4 LTS", "sw_notes": "",
    }  # fmt: skip
    return fields


STACK = {"cuda_version": "12.4.1", "cuda_driver_version": "550.54.15", "nccl_version": "2.21.5",
         "cudnn_version": "9.1.0.70", "openmpi_version": "4.1.7", "dali_version": "1.36.0",
         "kernel_version": "Linux 5.15.0-88-generic"}  # fmt: skip
# (system, nodes x accelerators, framework, epochs and epoch times of its runs, an aborted run)
ALPHA = [
    ("alpha_n2", 2, 8, "NVIDIA H100-SXM5-80GB", "MxNet NVIDIA Release 24.04",
     [(37, 3000), (37, 3100), (41, 2900), (37, 3050), (37, 2990)], None),
    ("alpha_n1", 1, 8, "NVIDIA A100-SXM4-80GB", "PyTorch NVIDIA Release 24.04",
     [(41, 9000), (41, 9100), (45, 8800), (41, 9300), (41, 9050)], 3),
]  # fmt: skip


def write_system(
    org_dir: Path,
    system: str,
    runs,
    aborted,
    *,
    nodes=2,
    per_node=8,
    accelerator="NVIDIA H100-SXM5-80GB",
    framework="MxNet NVIDIA Release 24.04",
    stack=None,
    batch=3264,
    start=1_700_000_000_000,
) -> list[Path]:
    """One system of a submitter: its description and its result files."""  # fmt: skip
    org = org_dir.name
    desc = description(org, system, nodes, per_node, accelerator, framework, stack or STACK)
    (org_dir / "systems").mkdir(parents=True, exist_ok=True)
    (org_dir / "systems" / f"{system}.json").write_text(json.dumps(desc, indent=2))
    folder = org_dir / "results" / system / "resnet"
    paths = []
    for index, (epochs, epoch_ms) in enumerate(runs):
        paths.append(
            write_log(folder / f"result_{index}.txt", start_ms=start + index * 10_000_000,
                      epochs=epochs, epoch_ms=epoch_ms, batch=batch, seed=index + 1, org=org,
                      aborted=index == aborted, final=0.62 if index == aborted else 0.7601,
                      optimizer="lars" if "MxNet" in framework else "sgd", nodes=nodes)
        )  # fmt: skip
    return paths


def make_tree(root: Path) -> Path:
    """A round: submitter Alpha (two systems, one with an aborted run) and Beta (a CPU system
    whose stack is text, and a result file that cannot be read)."""
    tree = root / ROUND_DIR
    for system, nodes, per_node, accelerator, framework, runs, aborted in ALPHA:
        write_system(tree / "Alpha", system, runs, aborted, nodes=nodes, per_node=per_node,
                     accelerator=accelerator, framework=framework,
                     batch=3264 if nodes == 2 else 1632)  # fmt: skip
    beta = tree / "Beta"
    write_system(beta, "beta_cpu", [(40, 60_000)] * 3, None, nodes=16, per_node=0,
                 accelerator="N/A", framework="TensorFlow 2.15.0",
                 stack="oneDNN 3.3, Intel MPI 2021.11, Driver 1.0")  # fmt: skip
    (beta / "results/beta_cpu/resnet/result_3.txt").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    return tree


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return make_tree(tmp_path_factory.mktemp("mlperf"))


@pytest.fixture(scope="module")
def imported(tree, tmp_path_factory) -> tuple[Path, str]:
    """The tree imported: (the records' directory, what import-mlperf printed)."""
    out = tmp_path_factory.mktemp("records")
    lines = []
    code = _main(["import-mlperf", str(tree), "--out", str(out)], lines)
    assert code == 0, lines
    return out, "\n".join(lines)


def _main(argv: list[str], lines: list[str]) -> int:
    """main(), its stdout into `lines` (the fixtures are module-scoped: no capsys)."""
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(argv)
    lines += buffer.getvalue().splitlines()
    return code


def _records(out: Path) -> dict[str, dict]:
    return {path.name: record.load(path) for path in sorted(out.glob("*.json"))}


def named(out: Path, slug: str) -> Path:
    """The one record of `out` named SLUG--DIGEST.json (10 hex digits of its identity)."""
    (path,) = [p for p in out.glob(f"{slug}--*.json") if re.fullmatch(r"[0-9a-f]{10}", p.stem[-10:])
               and p.stem[:-12] == slug]  # fmt: skip
    return path


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("hpcai500-tf: error:"), err
    return err


# ------------------------------------------------------------------------ the inputs are MLPerf's


def test_the_system_descriptions_pass_mlperfs_checker(tree):
    for path in sorted(tree.glob("*/systems/*.json")):
        valid, name, *_ = check_system_desc(str(path), "training", RULESET)
        assert valid, path
        assert name == path.stem


def test_the_logs_pass_mlperfs_compliance_checker_but_the_aborted_one(tree):
    from mlperf_logging.compliance_checker import mlp_compliance

    verdicts = {}
    for path in sorted(tree.glob("Alpha/results/*/resnet/result_*.txt")):
        checker = mlp_compliance.make_checker("training", RULESET, quiet=True, werror=False)
        valid, *_ = mlp_compliance.main(str(path), f"training_{RULESET}/common.yaml", checker)
        verdicts[f"{path.parts[-3]}/{path.name}"] = valid
    assert [name for name, valid in verdicts.items() if not valid] == ["alpha_n1/result_3.txt"]


# ------------------------------------------------------------------------ importing


def test_a_tree_gives_a_record_per_result_and_lists_what_it_cannot_read(imported):
    out, printed = imported
    records = _records(out)
    assert len(records) == 13  # 5 + 5 + 3; the unreadable file is not among them
    assert named(out, "v4.0--Alpha--alpha_n2--result_0").name in records
    assert re.search(r"skipped \S*Beta/results/beta_cpu/resnet/result_3.txt: not UTF-8", printed)
    assert "imported 13 of 14 result file(s)" in printed
    aborted = records[named(out, "v4.0--Alpha--alpha_n1--result_3").name]
    assert aborted["status"] == "stopped" and "run_stop says 'aborted'" in aborted["warnings"][0]
    assert not list(out.glob(".*.tmp"))  # nothing half-written


def test_the_layers_come_from_the_description_and_the_log(imported):
    out, _ = imported
    rec = record.load(named(out, "v4.0--Alpha--alpha_n2--result_2"))
    layers = rec["layers"]
    assert layers["L1"]["nodes"] == 2 and layers["L1"]["accelerators_per_node"] == 8
    assert layers["L1"]["accelerator_model"] == "NVIDIA H100-SXM5-80GB"
    assert layers["L1"]["accelerator_count"] == 16 and layers["L1"]["cpu_count"] == 4
    assert layers["L1"]["cpu_model"] == "Intel(R) Xeon(R) Platinum 8480C"
    assert layers["L1"]["host_memory_per_node"] == "2 TB"
    assert layers["L1"]["interconnect"] == "8x ConnectX-7 IB NDR 400 Gb/s"
    assert layers["L2"] == {"os": "Ubuntu 22.04.4 LTS", "cuda_driver_version": "550.54.15",
                            "kernel_version": "Linux 5.15.0-88-generic"}  # fmt: skip
    assert layers["L3"]["nccl_version"] == "2.21.5" and layers["L3"]["openmpi_version"] == "4.1.7"
    assert layers["L3"]["interconnect"] == "8x ConnectX-7 IB NDR 400 Gb/s"
    assert layers["L4"] == {"cuda_version": "12.4.1", "cudnn_version": "9.1.0.70",
                            "dali_version": "1.36.0"}  # fmt: skip
    assert layers["L5"]["framework"] == "mxnet" and layers["L5"]["framework_version"] == "24.04"
    assert rec["source"]["framework"] == "mxnet"
    assert layers["L6"]["global_batch"] == 3264 and layers["L6"]["workers"] == 16
    assert layers["L6"]["batch_per_worker"] == 204
    assert layers["L7"]["model"] == "resnet50_v1.5" and layers["L7"]["image_size"] == 224
    l8 = layers["L8"]
    assert (l8["optimizer"], l8["warmup_epochs"], l8["momentum"], l8["seed"]) == ("lars", 2, 0.9, 3)
    assert l8["lars_opt_weight_decay"] == 0.0002 and l8["lars_epsilon"] == 0.0
    assert layers["L9"]["target_quality"] == 0.759 and layers["L9"]["epochs"] == 41
    assert layers["L9"]["dataset"] == "imagenet-1k"
    assert rec["quality"]["target"] == 0.759 and rec["quality"]["reached_target"]
    assert rec["config"]["mlperf"]["submitter"] == "Alpha"
    assert rec["config"]["mlperf"]["round"] == "4.0"


def test_a_cpu_system_and_a_stack_given_as_text(imported):
    out, _ = imported
    layers = record.load(named(out, "v4.0--Beta--beta_cpu--result_0"))["layers"]
    assert layers["L1"]["accelerator_model"] is None and layers["L1"]["accelerator_count"] == 0
    assert layers["L1"]["summary"].startswith("32 x Intel(R) Xeon(R) Platinum 8480C (16 nodes")
    assert layers["L3"]["intel_mpi"] == "2021.11" and layers["L4"]["onednn"] == "3.3"
    assert layers["L2"]["driver"] == "1.0"
    assert (layers["L5"]["framework"], layers["L5"]["framework_version"]) == (
        "tensorflow",
        "2.15.0",
    )
    assert layers["L6"]["workers"] is None  # neither the log nor the description says
    assert layers["L8"]["optimizer"] == "sgd_momentum" and layers["L8"]["warmup_epochs"] == 3


def test_flops_per_example_come_from_the_model(imported):
    out, _ = imported
    flops = record.load(named(out, "v4.0--Alpha--alpha_n2--result_0"))["flops"]
    forward = analytical_flops.resnet50_v15_forward_flops()
    assert flops["basis"] == "analytical-resnet50-v1.5"
    assert flops["per_example_training"] == 3 * forward
    assert flops["analytical_per_example_forward"] == pytest.approx(8.18e9, rel=1e-3)
    assert "ResNet-50 v1.5 at 224x224" in flops["method"]


def test_the_analytical_count_is_the_keras_models():
    pytest.importorskip("tensorflow")
    from hpcai500_tf.models import resnet

    for size, classes in ((224, 1000), (224, 1001), (160, 10)):
        model = resnet.resnet50_v15(image_size=size, num_classes=classes)
        expected = resnet.analytical_forward_flops(model)
        assert analytical_flops.resnet50_v15_forward_flops(size, classes) == expected


def test_flops_per_example_on_the_command_line_override_the_model(tree, tmp_path, capsys):
    system = tree / "Alpha/results/alpha_n2"
    code = main(["import-mlperf", str(system), "--out", str(tmp_path), "--flops-per-example",
                 "3e10", "--framework", "mxnet-custom"])  # fmt: skip
    assert code == 0
    assert "imported 5 of 5" in capsys.readouterr().out
    rec = record.load(named(tmp_path, "v4.0--Alpha--alpha_n2--result_0"))
    assert rec["flops"]["per_example_training"] == 3e10 and rec["flops"]["basis"] == "submitter"
    assert rec["layers"]["L5"]["framework"] == rec["source"]["framework"] == "mxnet-custom"


def test_a_record_already_there_is_kept_and_nothing_new_is_no_error(imported, tree, capsys):
    out, _ = imported
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")}
    assert main(["import-mlperf", str(tree / "Alpha"), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        f"nothing new: 10 of 10 result file(s) already imported into {out} (kept, not "
        "rewritten); 0 skipped"
    ]
    assert captured.err == ""
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")} == before


def test_the_single_log_form_keeps_working(tree, tmp_path, capsys):
    log = tree / "Alpha/results/alpha_n2/resnet/result_0.txt"
    out = tmp_path / "one.json"
    argv = ["import-mlperf", str(log), "--framework", "mxnet", "--flops-per-example", "2.4e10"]
    assert main([*argv, "--out", str(out)]) == 0
    rec = record.load(out)
    assert rec["flops"]["per_example_training"] == 2.4e10 and "mlperf" not in rec["config"]
    assert rec["quality"]["achieved"] == pytest.approx(0.7601)


# ------------------------------------------------------------------------ submissions


def _rank(out: Path, convention: str) -> scoring.Ranking:
    records = [(str(path), record.load(path)) for path in sorted(out.glob("*.json"))]
    (ranking,) = scoring.rank_records(records, None, "free", convention=convention)
    return ranking


def _summarizer(tree: Path, tmp_path: Path) -> dict[str, float]:
    """result_summarizer's minutes per system, run on a copy of the submitter's folder (its
    RCP check may write scaling.json into the folder it reads)."""
    copy_dir = tmp_path / "Alpha"
    shutil.copytree(tree / "Alpha", copy_dir)
    command = [sys.executable, "-m", "mlperf_logging.result_summarizer", str(copy_dir),
               "training", RULESET, "--csv", str(tmp_path / "summary.csv")]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Dropping non-converged run(s) for Alpha alpha_n1/resnet" in done.stdout
    with (tmp_path / "summary.csv").open() as handle:
        return {row["system"]: float(row["resnet"]) for row in csv.DictReader(handle)}


def test_each_systems_time_is_what_mlperfs_result_summarizer_prints(imported, tree, tmp_path):
    out, _ = imported
    # alpha_n2's logs are multi-node: each of its 2 nodes logs the header at its own time
    multi_node = (tree / "Alpha/results/alpha_n2/resnet/result_0.txt").read_text()
    header = re.findall(r'"time_ms": (\d+), [^\n]*"key": "submission_benchmark"', multi_node)
    assert len(header) == 2 and len(set(header)) == 2
    minutes = _summarizer(tree, tmp_path)
    assert set(minutes) == {"alpha_n1", "alpha_n2"}
    ranking = _rank(out, "published-2020")
    ours = {s.label.split()[-1]: s for s in ranking.submissions if s.rule == "mlperf"}
    for system, expected in minutes.items():
        # equal but for float rounding of timestamps kept in seconds since 1970 (~0.1 us)
        assert ours[system].time_to_quality_s / 60 == pytest.approx(expected, rel=1e-9)
    # the aborted run counts as the slowest: only the fastest is dropped beside it
    n1 = ours["alpha_n1"]
    assert len(n1.not_converged) == 1 and len(n1.paths) == 4 and len(n1.dropped) == 2


def test_a_system_time_is_the_olympic_mean_of_run_stop_minus_run_start(imported):
    out, _ = imported
    runs = [record.load(p) for p in sorted(out.glob("v4.0--Alpha--alpha_n2--*.json"))]
    times = sorted(r["timeline"]["run_stop"] - r["timeline"]["run_start"] for r in runs)
    (n2,) = [s for s in _rank(out, "published-2020").submissions if s.label == "Alpha alpha_n2"]
    assert n2.time_to_quality_s == pytest.approx(sum(times[1:-1]) / 3)
    assert n2.system == {"accelerator": "NVIDIA H100-SXM5-80GB", "accelerators": 16, "nodes": 2,
                         "framework": "mxnet 24.04"}  # fmt: skip
    assert n2.scores[0].reading.startswith(scoring.MLPERF_READING)


def test_two_runs_that_did_not_converge_refuse_the_submission(imported):
    out, _ = imported
    records = [(str(p), record.load(p)) for p in sorted(out.glob("v4.0--Alpha--alpha_n1--*"))]
    second = copy.deepcopy(records[0][1])
    second["status"] = "stopped"
    records[0] = (records[0][0], second)
    ic = config.load_benchmark("image_classification")
    levels, repeatability = config.load_levels()
    ranking = scoring.rank(records, ic, levels["free"], repeatability, convention="published-2020")
    assert ranking.submissions == []
    reasons = {reason for _, rs in ranking.refused for reason in rs}
    assert reasons == {"MLPerf's rule: 2 of the system's 5 runs did not converge; at most 1 may "
                       "(it counts as the slowest)"}  # fmt: skip


# ------------------------------------------------------------------------ ranking


def test_at_hpc_ai500s_own_problem_each_mlperf_result_says_why_it_is_not_rankable(imported):
    out, _ = imported
    ranking = _rank(out, "stated")
    assert ranking.submissions == [] and len(ranking.refused) == 13
    reasons = dict(ranking.refused)[str(named(out, "v4.0--Alpha--alpha_n2--result_0"))]
    assert reasons == ["L9 problem: target_quality 0.759 is not 0.763",
                       "L9 problem: epochs 37 is not 90"]  # fmt: skip


def test_the_published_conventions_place_them_beside_the_nine_2020_entries(imported, capsys):
    out, _ = imported
    assert main(["rank", *map(str, sorted(out.glob("*.json"))), "--convention", "published-2020",
                 "--json"]) == 0  # fmt: skip
    ranking = json.loads(capsys.readouterr().out)
    labels = [s["label"] for s in ranking["submissions"]]
    assert len(labels) == 12 and "Fujitsu" in labels and "Alpha alpha_n2" in labels
    assert all(s["flop_basis"] == ["analytical-resnet50-v1"] for s in ranking["submissions"])
    n2 = next(s for s in ranking["submissions"] if s["label"] == "Alpha alpha_n2")
    assert (n2["accelerator"], n2["accelerators"], n2["nodes"]) == ("NVIDIA H100-SXM5-80GB", 16, 2)
    assert n2["framework"] == "mxnet 24.04" and n2["rule"] == "mlperf" and n2["runs"] == 5
    # the mean over the runs MLPerf's rule keeps of the 2020 table's fixed 90-epoch count over
    # MLPerf's time, quality against 0.763, n = 10
    runs = [record.load(p) for p in sorted(out.glob("v4.0--Alpha--alpha_n2--*.json"))]
    kept = sorted(r["timeline"]["run_stop"] - r["timeline"]["run_start"] for r in runs)[1:-1]
    factor = (0.7601 / 0.763) ** 10
    expected = sum(23.16e9 * 90 * IMAGENET / seconds * factor for seconds in kept) / 3
    assert n2["valid_flops"] == pytest.approx(expected, rel=1e-9)
    assert n2["quality"] == pytest.approx(0.7601)
    beta = next(s for s in ranking["submissions"] if s["label"] == "Beta beta_cpu")
    assert beta["notes"] == ["3 run(s): fewer than the 5 MLPerf asks"]


def test_the_rank_table_names_accelerator_count_nodes_and_framework(imported, capsys, monkeypatch):
    from hpcai500_tf.report.console import console

    monkeypatch.setattr(console, "width", 200)  # a terminal as wide as the table
    out, _ = imported
    argv = ["rank", *map(str, sorted(out.glob("*.json"))), "--convention", "published-2020"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if "Alpha alpha_n1" in line)
    for text in ("8 x NVIDIA A100-SXM4-80GB", " 1 ", "pytorch 24.04", "5 (1 did not converge)"):
        assert text in row
    assert "Fujitsu" in table and "FLOP basis: analytical-resnet50-v1" in table


def test_the_report_ranks_them_beside_the_published_entries(imported, tmp_path):
    out, _ = imported
    pages = tmp_path / "pages"
    assert main(["report", *map(str, sorted(out.glob("*.json"))), "--out", str(pages)]) == 0
    index = (pages / "index.html").read_text()
    published = index.split('id="ranking-image_classification-published-2020"')[1]
    # the leaderboard's cells: rank, system, submitter, accelerator, count, nodes, framework,
    # ..., the runs
    cell = r"<td[^>]*>(.*?)</td>"
    rows = re.findall(r"<tr [^>]*>" + cell * 7 + r"(.*?)</tr>", published)
    assert len(rows) == 12
    n2 = next(row for row in rows if "Alpha alpha_n2" in row[1])
    page_name = named(out, "v4.0--Alpha--alpha_n2--result_0").with_suffix(".html").name
    assert f'href="{page_name}"' in n2[7]
    assert n2[2:7] == ("Alpha", "NVIDIA H100-SXM5-80GB", "16", "2", "mxnet 24.04")
    assert any("Fujitsu (published 2020)" in row[1] for row in rows)
    refused = index.split('id="refused"')[1]
    assert refused.count("L9 problem: target_quality 0.759 is not 0.763") == 13
    page = (pages / page_name).read_text()
    assert "run_stop - run_start" in page and "NVIDIA H100-SXM5-80GB" in page


# ------------------------------------------------------------------------ bad input


def _bad_tree(root: Path) -> Path:
    """A submitter with a good system and every kind of bad input beside it."""
    org = root / "Gamma"
    good = write_system(org, "good", [(37, 3000)] * 2, None)
    log = good[0].read_text().splitlines()
    folder = org / "results" / "good" / "resnet"

    def variant(name: str, lines: list[str]) -> None:
        (folder / name).write_text("\n".join(lines) + "\n")

    variant("result_2.txt", [line for line in log if '"run_start"' not in line])
    variant("result_3.txt", [line for line in log if '"run_stop"' not in line])
    start = next(i for i, line in enumerate(log) if '"run_start"' in line)
    moved = log[start].replace('"time_ms": ', '"time_ms": 1')
    variant("result_4.txt", log[: start + 1] + [moved] + log[start + 1 :])  # a second run_start
    variant("result_5.txt", log + log[-3:])  # the last two MLLOG lines again, word for word
    stop = next(i for i, line in enumerate(log) if '"run_stop"' in line)
    variant("result_6.txt", log[:start] + [log[stop]] + log[start:stop] + log[stop + 1 :])
    evals = [i for i, line in enumerate(log) if '"eval_accuracy"' in line]
    swapped = list(log)
    swapped[evals[2]], swapped[evals[5]] = log[evals[5]], log[evals[2]]
    variant("result_7.txt", swapped)
    variant("result_8.txt", [line.replace('"value": "resnet"', '"value": "ssd"') for line in log])
    write_log(org / "results" / "good" / "bert" / "result_0.txt", start_ms=1, epochs=4,
              epoch_ms=10, benchmark="bert")  # fmt: skip
    (org / "results" / "nodesc" / "resnet").mkdir(parents=True)
    shutil.copy(good[0], org / "results" / "nodesc" / "resnet" / "result_0.txt")
    (org / "results" / "badjson" / "resnet").mkdir(parents=True)
    shutil.copy(good[0], org / "results" / "badjson" / "resnet" / "result_0.txt")
    (org / "systems" / "badjson.json").write_text('{"submitter": "Gamma", ')
    return org


def test_bad_input_is_listed_per_file_and_the_rest_imported(tmp_path, capsys):
    org = _bad_tree(tmp_path)
    out = tmp_path / "out"
    assert main(["import-mlperf", str(org), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    skipped = dict(re.findall(r"^skipped \S*?((?:good|nodesc|badjson)/\w+/result_\d)\.txt: (.*)$",
                              printed, re.M))  # fmt: skip
    expected = {
        "good/resnet/result_2": "lacks keys the record needs: run_start",
        "good/resnet/result_3": "lacks keys the record needs: run_stop",
        "good/resnet/result_4": "2 different 'run_start' lines",
        "good/resnet/result_6": "the log's lines are out of order",
        "good/resnet/result_7": "the log's lines are out of order",
        "good/resnet/result_8": "the log is MLPerf's 'ssd', not ResNet",
        "good/bert/result_0": "MLPerf's 'bert' (its folder), not ResNet",
        "nodesc/resnet/result_0": "no such system description",
        "badjson/resnet/result_0": "not JSON",
    }
    assert set(skipped) == set(expected), printed
    for name, words in expected.items():
        assert words in skipped[name], (name, skipped[name])
    assert re.search(r"warning \S*result_5.txt: 2 repeated :::MLLOG line\(s\) read once", printed)
    assert sorted(p.name for p in out.glob("*.json")) == sorted(
        named(out, f"Gamma--good--result_{n}").name for n in (0, 1, 5)
    )
    assert len(list(out.glob("*.json"))) == 3


@pytest.mark.parametrize("kind", ["empty", "no resnet", "unreadable only"])
def test_nothing_to_import_is_one_line_and_exit_2(tmp_path, capsys, kind):
    tree = tmp_path / "tree"
    if kind == "empty":
        (tree / "Org" / "results").mkdir(parents=True)
        words = "no MLPerf result files under it"
    elif kind == "no resnet":
        write_log(tree / "Org/results/s/bert/result_0.txt", start_ms=1, epochs=4, epoch_ms=10,
                  benchmark="bert")  # fmt: skip
        words = "nothing imported: none of its 1 result file(s)"
    else:
        (tree / "Org/results/s/resnet").mkdir(parents=True)
        (tree / "Org/results/s/resnet/result_0.txt").write_text("no log here\n")
        words = "nothing imported"
    assert main(["import-mlperf", str(tree), "--out", str(tmp_path / "out")]) == 2
    assert words in one_line_error(capsys)
    assert not (tmp_path / "out").exists()  # nothing written, not even the directory


def test_a_tree_needs_an_output_directory(tree, capsys):
    assert main(["import-mlperf", str(tree)]) == 2
    assert "needs --out DIR" in one_line_error(capsys)
    assert main(["import-mlperf", str(tree), "--out", "x", "--sidecar", "s.toml"]) == 2
    assert "--sidecar is for one log" in one_line_error(capsys)


def test_a_scaling_file_scales_the_systems_time_as_mlperf_does(tree, tmp_path, capsys):
    system = tmp_path / ROUND_DIR / "Alpha" / "results" / "alpha_n2"
    shutil.copytree(tree / "Alpha" / "results" / "alpha_n2", system)
    shutil.copytree(tree / "Alpha" / "systems", tmp_path / ROUND_DIR / "Alpha" / "systems")
    (system / "resnet" / "scaling.json").write_text('{"scaling_factor": 1.25}')
    assert main(["import-mlperf", str(system), "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    (scaled,) = [s for s in _rank(tmp_path / "out", "published-2020").submissions
                 if s.rule == "mlperf"]  # fmt: skip
    runs = [record.load(p) for p in sorted((tmp_path / "out").glob("*.json"))]
    times = sorted(r["timeline"]["run_stop"] - r["timeline"]["run_start"] for r in runs)
    assert scaled.time_to_quality_s == pytest.approx(1.25 * sum(times[1:-1]) / 3)


def test_a_benchmark_folder_given_as_dot_or_a_link_finds_its_system(tree, tmp_path, monkeypatch):
    benchmark = tree / "Alpha" / "results" / "alpha_n2" / "resnet"
    linked = tmp_path / "linked-resnet"
    linked.symlink_to(benchmark)
    for given, where in ((".", benchmark), (str(linked), tmp_path)):
        monkeypatch.chdir(where)
        out = tmp_path / f"out-{len(given)}"
        assert main(["import-mlperf", given, "--out", str(out)]) == 0, given
        names = sorted(path.name for path in out.glob("*.json"))
        assert len(names) == len(list(benchmark.glob("result_*.txt"))), given
        assert all(name.startswith("v4.0--Alpha--alpha_n2--result_") for name in names), names


# ------------------------------------------------------------------------ a round's size


@pytest.mark.slow
def test_a_round_of_two_hundred_results(tmp_path, capsys):
    """40 systems of 5 results, imported, ranked and reported (the timing of a round this
    size: benchmarks/mlperf_tree_scale.py)."""
    tree = tmp_path / ROUND_DIR
    for org in range(8):
        for system in range(5):
            start = 1_700_000_000_000 + system * 10**9
            runs = [(37 + system, 3000)] * 5
            write_system(tree / f"Org{org}", f"sys{org}_{system}", runs, None, nodes=system + 1,
                         start=start)  # fmt: skip
    out = tmp_path / "out"
    assert main(["import-mlperf", str(tree), "--out", str(out)]) == 0
    assert "imported 200 of 200" in capsys.readouterr().out
    ranking = _rank(out, "published-2020")
    assert sum(s.rule == "mlperf" for s in ranking.submissions) == 40
    assert (
        main(["report", *map(str, sorted(out.glob("*.json"))), "--out", str(tmp_path / "p")]) == 0
    )
    assert math.isfinite(ranking.submissions[0].valid_flops)
