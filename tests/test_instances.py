"""`train BENCHMARK --instances M` (cluster/instances.py, instance_launch.py) and its
throughput record and score (run/throughput.py): the split of workers, GPUs and Slurm
tasks, bad input in one line before any training, M runs at once, the window and the models
per minute recomputed from the members' MLPerf logs, a lost instance, one stop for all."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcai500_tf import record
from hpcai500_tf.cli import main
from hpcai500_tf.cluster import instances
from hpcai500_tf.errors import UserError
from hpcai500_tf.run import throughput
from tests.fake_members import member_notes

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["train", "image_classification", "--preset", "tiny", "--no-tensorboard", "--power-hz", "0"]


# ----------------------------------------------------------------------------- the plan


@pytest.mark.parametrize(
    ("count", "workers", "words"),
    [
        (0, None, "--instances must be in [1, 1024], got 0"),
        (3, 2, "--instances 3 is more than the 2 worker(s)"),
        (2, 3, "--instances 2 does not divide --workers 3"),
    ],
)
def test_counts_that_cannot_be_split_are_refused(count, workers, words):
    with pytest.raises(UserError, match=None) as refused:
        instances.check_count(count, workers)
    assert str(refused.value).startswith(words)


def test_workers_are_split_evenly_and_each_instance_gets_its_gpus_and_threads():
    plan = instances.local_plan(2, 4, ["0", "1", "2", "3"], {}, cpus=8)
    assert plan.workers_per_instance == 2
    assert [env["CUDA_VISIBLE_DEVICES"] for env in plan.environments] == ["0,1", "2,3"]
    assert {env["TF_NUM_INTRAOP_THREADS"] for env in plan.environments} == {"2"}  # 8 / 4
    kept = instances.local_plan(2, None, [], {"OMP_NUM_THREADS": "7"}, cpus=8)
    assert all("OMP_NUM_THREADS" not in env for env in kept.environments)
    with pytest.raises(UserError, match="does not divide this machine's 3 GPU"):
        instances.local_plan(2, None, ["0", "1", "2"], {}, cpus=8)


def _step(nodes: str, counts: str, tasks: int, procid: int) -> dict:
    return {
        "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid),
        "SLURM_NTASKS": str(tasks), "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_STEP_NODELIST": nodes, "SLURM_STEP_TASKS_PER_NODE": counts,
    }  # fmt: skip


def test_a_two_node_step_gives_one_single_worker_instance_per_node():
    for procid, node in ((0, "node1"), (1, "node2")):
        group = instances.slurm_group(2, _step("node[1-2]", "1(x2)", 2, procid))
        assert (group.instance, group.chief, group.nodes) == (procid, True, (node,))
        seen = instances.apply_group(_step("node[1-2]", "1(x2)", 2, procid), group)
        # one task alone: no Slurm cluster, so no collective can reach the other instance
        assert "SLURM_PROCID" not in seen and "SLURM_STEP_NUM_TASKS" not in seen
        assert seen["SLURM_STEP_NODELIST"] == node


def test_a_four_node_step_gives_two_instances_of_two_nodes_each():
    group = instances.slurm_group(2, _step("n[1-4]", "2(x4)", 8, 5))
    assert (group.instance, group.index_in_group, group.nodes) == (1, 1, ("n3", "n4"))
    assert group.environment["SLURM_STEP_TASKS_PER_NODE"] == "2(x2)"
    assert group.environment["SLURM_STEP_NUM_TASKS"] == "4"
    # A batch script's PyTorch rendezvous for the whole step would join both instances into
    # one: each makes its own from its group (n3, its first port).
    exported = {"MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
    seen = instances.apply_group({**_step("n[1-4]", "2(x4)", 8, 5), **exported}, group)
    assert not set(exported) & set(seen)
    from hpcai500_tf.pytorch import distributed

    workers = distributed.workers_from_environment({**seen, "SLURM_LOCALID": "1"})
    assert (workers.world_size, workers.rank, workers.master_addr) == (4, 1, "n3")


@pytest.mark.parametrize(
    ("step", "words"),
    [
        (_step("n[1-3]", "1(x3)", 3, 0), "cannot be split into 2 groups of whole nodes"),
        (_step("n[1-2]", "2,1", 3, 0), "its nodes run different task counts"),
        (_step("n1", "1", 1, 0), "more than the Slurm step's 1 task"),
    ],
)
def test_a_slurm_layout_that_does_not_match_is_refused(step, words):
    with pytest.raises(UserError, match=words):
        instances.slurm_group(2, step)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("extra", "environ", "words"),
    [
        (["--instances", "0"], {}, "--instances must be in [1, 1024], got 0"),
        (["--instances", "3", "--workers", "2"], {}, "--instances 3 is more than the 2"),
        (["--instances", "2", "--workers", "3"], {}, "--instances 2 does not divide --workers 3"),
        (
            ["--instances", "2"],
            _step("n[1-3]", "1(x3)", 3, 0),
            "--instances 2 does not match the Slurm step: its 3 node(s)",
        ),
        (["--instances", "2", "--resume", "x"], {}, "--instances starts new runs"),
        (
            ["--instances", "2", "--meter-log", "meter.csv"],
            _step("n[1-2]", "1(x2)", 2, 0),
            "--meter-log: one node meter's log cannot stand for the 2 instances' nodes",
        ),
    ],
)
def test_bad_input_is_one_line_before_any_training(tmp_path, capsys, monkeypatch, extra, environ,
                                                   words):  # fmt: skip
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    if "--resume" in extra:
        (tmp_path / "x").mkdir()
        run = tmp_path / "x"
        (run / "config.json").write_text("{}")
        extra = [*extra[:-1], str(run)]
    out = tmp_path / "runs"
    monkeypatch.setattr("hpcai500_tf.run.state.check_run_files", lambda path: None)
    monkeypatch.setattr(
        "hpcai500_tf.run.state.read_state", lambda path: {"framework": "tensorflow"}
    )
    assert main([*TRAIN, "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not out.exists() or not any(out.iterdir())  # nothing started, nothing made


# ----------------------------------------------------------------------------- real runs


def _cli(args: list[str], **options) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "hpcai500_tf.cli", *args], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **options,
    )  # fmt: skip


def _mlperf_times(log: Path) -> tuple[float, float]:
    """run_start and run_stop of one MLPerf log, read here from its lines."""
    entries = [json.loads(line[len(":::MLLOG ") :]) for line in log.read_text().splitlines()]
    start = next(e["time_ms"] for e in entries if e["key"] == "run_start")
    stop = [e["time_ms"] for e in entries if e["key"] == "run_stop"][-1]
    return start / 1000, stop / 1000


@pytest.fixture(scope="module")
def two_instances(tmp_path_factory):
    out = tmp_path_factory.mktemp("instances")
    process = _cli([*TRAIN, "--instances", "2", "--out", str(out)])
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    (path,) = out.glob("*/throughput.json")
    return path, output


@pytest.mark.slow
def test_two_instances_make_two_runs_and_a_throughput_the_test_recomputes(two_instances):
    path, output = two_instances
    data = throughput.load(path)
    assert data["status"] == "completed" and data["instances"] == 2
    assert [m["seed"] for m in data["members"]] == [10, 11]  # independent models
    times, records = [], []
    for member in data["members"]:
        run_dir = path.parent / member["run_dir"]
        records.append(record.load(run_dir / "record.json"))
        times.append(_mlperf_times(run_dir / "mlperf.log"))
    assert {r["layers"]["L8"]["seed"] for r in records} == {10, 11}
    start, stop = min(t[0] for t in times), max(t[1] for t in times)
    assert data["window"] == pytest.approx({"start": start, "stop": stop})
    counted = sum(r["status"] == "completed" and r["quality"]["reached_target"] for r in records)
    one = throughput.score(path)
    assert one.window_s == pytest.approx(stop - start)
    assert one.counted == counted
    assert one.models_per_minute == pytest.approx(counted / ((stop - start) / 60))
    total = sum(r["flops"]["total"] for r in records if r["quality"]["reached_target"])
    assert one.aggregate_flops == pytest.approx(total / (stop - start))
    assert f"{one.models_per_minute:.3g} models/min" in output


@pytest.mark.slow
def test_instances_that_differ_in_a_layer_are_refused_naming_it(two_instances, tmp_path, capsys):
    path, _ = two_instances
    copy = tmp_path / "copy"
    shutil.copytree(path.parent, copy)
    member = throughput.load(copy / "throughput.json")["members"][1]
    changed = copy / member["run_dir"] / "record.json"
    data = json.loads(changed.read_text())
    data["layers"]["L5"]["framework_version"] = "0.0-other"
    changed.write_text(json.dumps(data))
    with pytest.raises(UserError, match=r"differ in layer L5 \(framework_version\)"):
        throughput.score(copy / "throughput.json")
    assert main(["rank", str(copy / "throughput.json")]) == 0  # refused, shown, not ranked
    shown = " ".join(capsys.readouterr().out.replace("│", " ").split())  # the table's cells wrap
    assert "differ in layer L5" in shown


@pytest.mark.slow
def test_rank_keeps_throughput_apart_from_time_to_quality_records(two_instances, capsys):
    path, _ = two_instances
    member = throughput.load(path)["members"][0]
    run_record = path.parent / member["run_dir"] / "record.json"
    assert main(["rank", "--json", str(path)]) == 0
    (ranking,) = json.loads(capsys.readouterr().out)
    assert (ranking["form"], ranking["benchmark"]) == ("weak_scaling", "image_classification")
    # the tiny preset's problem is not the benchmark's: refused by the rules a run is ranked by
    assert ranking["entries"] == [] and ranking["refused"][0]["record"] == str(path)
    assert any("L9 problem" in why for why in ranking["refused"][0]["reasons"])
    assert main(["rank", str(path), str(run_record)]) == 0
    shown = capsys.readouterr().out
    assert "throughput (weak_scaling)" in shown and "free level, convention stated" in shown


def _pid_of(process: subprocess.Popen, index: int, lines: list[str]) -> int:
    for line in process.stdout:
        lines.append(line)
        if line.startswith(f"instance {index}: pid "):
            return int(line.split()[3].rstrip(","))
    raise AssertionError("".join(lines))


def _wait_for_run_start(parent: Path, index: int, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for log in parent.glob(f"instance-{index}/*/mlperf.log"):
            if '"run_start"' in log.read_text():
                return
        time.sleep(0.2)
    raise AssertionError(f"instance {index} never began its timed run")


@pytest.mark.slow
def test_a_killed_instance_is_recorded_and_the_other_completes(tmp_path):
    process = _cli(
        [*TRAIN, "--set", "training.epochs=6", "--instances", "2", "--out", str(tmp_path)]
    )
    lines = []
    victim = _pid_of(process, 1, lines)
    (parent,) = tmp_path.glob("*-x2-*")
    _wait_for_run_start(parent, 1)
    os.kill(victim, signal.SIGKILL)
    output, _ = process.communicate(timeout=300)  # no hang: the other instance ends alone
    assert process.returncode == 1, "".join(lines) + output
    data = throughput.load(parent / "throughput.json")
    assert data["status"] == "completed"
    assert [m["ended"] for m in data["members"]] == ["exited 0", "killed by SIGKILL"]
    one = throughput.score(parent / "throughput.json")
    assert not one.members[1]["counted"] and "no record" in one.members[1]["why"]
    assert one.counted == int(one.members[0]["counted"])
    killed_start, _ = _mlperf_times_start_only(parent / data["members"][1]["run_dir"])
    assert one.window_s >= data["window"]["stop"] - killed_start - 1e-3  # it stays in the window


def _mlperf_times_start_only(run_dir: Path) -> tuple[float, None]:
    entries = [
        json.loads(line[len(":::MLLOG ") :])
        for line in (run_dir / "mlperf.log").read_text().splitlines()
        if line.startswith(":::MLLOG ")
    ]
    return next(e["time_ms"] for e in entries if e["key"] == "run_start") / 1000, None


@pytest.mark.slow
def test_sigterm_stops_every_instance_as_one_stop(tmp_path):
    process = _cli(
        [*TRAIN, "--set", "training.epochs=6", "--instances", "2", "--out", str(tmp_path)]
    )
    lines = []
    _pid_of(process, 1, lines)
    (parent,) = tmp_path.glob("*-x2-*")
    for index in (0, 1):
        _wait_for_run_start(parent, index)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, "".join(lines) + output
    data = throughput.load(parent / "throughput.json")
    assert data["status"] == "stopped"
    for member in data["members"]:
        rec = record.load(parent / member["run_dir"] / "record.json")
        assert rec["status"] == "stopped"  # each kept its work, resumable on its own
    with pytest.raises(UserError, match="were stopped"):
        throughput.score(parent / "throughput.json")


@pytest.mark.slow
def test_report_gives_the_throughput_its_page_with_the_members_curves(two_instances, tmp_path):
    path, _ = two_instances
    assert main(["report", str(path.parent), "--out", str(tmp_path / "report")]) == 0
    (page,) = (tmp_path / "report").glob("throughput-*.html")
    text = page.read_text()
    one = throughput.score(path)
    assert f"{one.models_per_minute:.4g} models/min" in text
    assert "instance 0 (seed 10)" in text and "instance 1 (seed 11)" in text  # both curves
    assert text.count("<svg") == 1
    assert "The nine layers (every instance" in text


@pytest.mark.slow
def test_pytorch_instances_make_a_throughput_record_too(tmp_path, torch_installed):
    process = _cli([*TRAIN, "--framework", "pytorch", "--instances", "2", "--out", str(tmp_path)])
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    (path,) = tmp_path.glob("*/throughput.json")
    for member in throughput.load(path)["members"]:
        rec = record.load(path.parent / member["run_dir"] / "record.json")
        assert rec["source"]["framework"] == "pytorch" and rec["status"] == "completed"
    assert throughput.score(path).instances == 2


def test_the_throughput_modules_import_without_a_framework():
    code = (
        "import sys\n"
        "for name in ('tensorflow', 'keras', 'torch'):\n"
        "    sys.modules[name] = None\n"
        "import hpcai500_tf.cluster.instances, hpcai500_tf.run.throughput\n"
        "import hpcai500_tf.report.throughput_view, hpcai500_tf.report.throughput_page\n"
        "import hpcai500_tf.run.instance_launch\n"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )


def test_the_window_energy_is_the_machine_sampled_once_over_the_window(tmp_path):
    """Power sampled by the process that starts the instances, over the window its members'
    MLPerf logs give: each source once, never once per instance."""
    from hpcai500_tf.energy.sampler import PowerSampler
    from hpcai500_tf.energy.sources import Source
    from hpcai500_tf.run import window_energy

    node = Source("meter", "whole node", "power", "a fake node meter", read_value=lambda: 250.0)
    sampler = PowerSampler([node], hz=200).start()
    began = time.time()
    time.sleep(0.4)
    ended = time.time()
    time.sleep(0.1)
    sampler.stop()
    windows = [(began, began + 0.2), (began + 0.1, ended)]
    members = member_notes(tmp_path, windows, ["here", "here"])
    (start, stop), energy, _ = window_energy.sampled(tmp_path, members, sampler, [], 200)
    assert start == pytest.approx(began, abs=1e-3)
    assert stop == pytest.approx(ended, abs=1e-3)
    assert energy["measured"] and energy["average_watts"] == pytest.approx(250.0)
    assert energy["joules"] == pytest.approx(250.0 * (ended - began), rel=0.05)


def test_the_machines_meter_log_is_read_over_the_window_once(tmp_path):
    """On one machine a node meter log (--meter-log) is the machine's: read over the window
    beside what was sampled, once, never once per instance; one that cannot be read leaves the
    window not measured, saying why."""
    from hpcai500_tf.run import window_energy

    began = 1_000_000.0
    meter = tmp_path / "meter.csv"
    readings = "".join(f"{began + t},{300 + t}\n" for t in range(-5, 40))
    meter.write_text("timestamp,watts\n" + readings)
    windows = [(began, began + 20), (began + 10, began + 30)]
    members = member_notes(tmp_path, windows, ["h", "h"])
    (start, stop), energy, _ = window_energy.sampled(tmp_path, members, None, [], 0, str(meter))
    assert (start, stop) == (began, began + 30)
    assert energy["measured"] and energy["meter_log"] == str(meter)
    assert energy["joules"] == pytest.approx(sum(300 + t + 0.5 for t in range(30)))
    meter.write_text("no readings here\n")
    _, energy, warnings = window_energy.sampled(tmp_path, members, None, [], 0, str(meter))
    assert not energy["measured"] and "meter log not used" in energy["reason"]


def test_an_instance_of_several_workers_is_a_workers_run_of_its_own(tmp_path):
    """Each instance's command: the user's arguments, its own seed and directory, and
    `--workers N/M` where it has several (its own launcher: its own TF_CONFIG and ports)."""
    from hpcai500_tf.cli import build_parser
    from hpcai500_tf.run import instance_launch

    args = build_parser().parse_args([*TRAIN, "--instances", "2", "--workers", "4"])
    command = instance_launch.child_arguments(args, 11, 2, tmp_path / "instance-1")
    assert command[1:4] == ["-m", "hpcai500_tf.cli", "train"]
    text = " ".join(command)
    assert "--set training.seed=11 --workers 2 --out" in text and "--instances" not in text
    single = instance_launch.child_arguments(args, 10, 1, tmp_path / "instance-0")
    assert "--workers" not in single


@pytest.mark.slow
def test_bad_input_every_instance_refuses_is_one_line_and_nothing_is_kept(tmp_path):
    missing = tmp_path / "no-such-data"
    process = _cli(
        [*TRAIN, "--set", "data.source=imagenet", "--data", str(missing), "--instances", "2",
         "--out", str(tmp_path / "runs")]
    )  # fmt: skip
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 2, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("hpcai500-tf: error: ") and "no-such-data" in last, output
    assert not any((tmp_path / "runs").iterdir())  # no parent directory left behind


NOT_MEASURED = {
    "measured": False, "reason": "no power source", "joules": None, "interval_s": None,
    "scope": None, "average_watts": None, "coverage": None, "sample_hz": None,
    "parts_measured": [], "parts_not_measured": [], "quality_flags": [], "sources": [],
}  # fmt: skip


def _throughput_record(**changes) -> dict:
    member = {"index": 0, "seed": 10, "run_dir": "instance-0/run", "exit_code": 0,
              "ended": "exited 0", "hosts": ["here"]}  # fmt: skip
    data = {
        "schema_version": 1, "kind": throughput.KIND, "form": "weak_scaling",
        "status": "completed", "benchmark": "image_classification", "preset": "tiny",
        "instances": 1, "workers_per_instance": 1, "placement": "local",
        "rule": dict(throughput.RULE), "members": [member],
        "window": {"start": 1.0, "stop": 2.0}, "energy": NOT_MEASURED, "warnings": [],
        "source": {"tool": "hpcai500-tf", "tool_version": "0"},
    }  # fmt: skip
    for key, value in changes.items():
        if key.startswith("member_"):
            member[key.removeprefix("member_")] = value
        else:
            data[key] = value
    return data


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"kind": "hpcai500-record"}, "not a throughput record"),
        ({"form": "strong"}, "'form' must be one of weak_scaling"),
        ({"instances": 2}, "'instances' must be the number of members"),
        ({"member_run_dir": "/etc"}, "a path inside the record's directory"),
        ({"member_run_dir": "../elsewhere"}, "a path inside the record's directory"),
        ({"window": {"start": 2.0, "stop": 1.0}}, "'window.stop' must be after window.start"),
        ({"schema_version": 7}, "schema_version 7 is not supported"),
        ({"energy": {}}, "missing key 'energy.measured'"),
    ],
)
def test_a_throughput_record_that_does_not_hold_is_refused_in_one_line(changes, words, tmp_path):
    path = tmp_path / "throughput.json"
    path.write_text(json.dumps(_throughput_record(**changes)))
    with pytest.raises(UserError, match=None) as refused:
        throughput.load(path)
    assert words in str(refused.value) and "\n" not in str(refused.value)
    assert throughput.validate(_throughput_record(), path)["instances"] == 1


def test_mlperf_times_read_past_a_line_cut_by_a_kill(tmp_path):
    log = tmp_path / "mlperf.log"
    log.write_text(
        ':::MLLOG {"key": "init_start", "time_ms": 500}\n'
        ':::MLLOG {"key": "run_start", "time_ms": 1000}\n'
        ':::MLLOG {"key": "epoch_st'  # the process was killed while writing
    )
    assert throughput.mlperf_times(log) == (1.0, None, None)
    assert throughput.mlperf_times(tmp_path / "none.log") == (None, None, None)


def test_a_throughput_record_is_told_by_its_top_level_kind_only(tmp_path):
    from hpcai500_tf.run import throughput

    nested = tmp_path / "nested.json"  # a run record whose sidecar layer says "kind"
    nested.write_text(
        json.dumps({"kind": "hpcai500-record", "layers": {"L1": {"kind": throughput.KIND}}})
    )
    late = tmp_path / "late.json"  # the kind after 4 KiB of other keys
    late.write_text(json.dumps({"notes": "x" * 5000, "kind": throughput.KIND}))
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"kind": throughput.KIND})[:-1] + ", ")
    assert [throughput.is_throughput(p) for p in (nested, late, broken)] == [False, True, False]
