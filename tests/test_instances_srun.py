"""`train --instances M` under srun, without a Slurm: the window's energy from the members'
records (run/window_energy.py, simulated sensors through the project's sampler) and a stop
that reaches every task of the step (run/slurm_task.py, a plain child in place of `train`)."""

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from hpcai500_tf.energy import sampler as power
from hpcai500_tf.energy.sources import Source
from hpcai500_tf.results import scoring
from hpcai500_tf.run import window_energy
from tests.fake_members import member_notes

ROOT = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _counter(watts: float, clock: Clock):
    """A cumulative energy counter at constant power, read off the simulated clock."""
    return lambda: watts * clock.now


def _member_energy(sources: list[Source], start: float, stop: float, notes=()) -> dict:
    """A member's record energy block as one run makes it: its sources sampled at 10 Hz over
    its timed run [start, stop], put through the record's block."""
    clock = Clock(start - 0.05)
    for source in sources:
        source.read_value = source.read_value(clock)
    sampler = power.PowerSampler(sources, hz=10, clock=clock)
    while clock.now <= stop + 0.1:
        sampler.sample_once()
        clock.now += 0.1
    block, _ = power.energy_block(sampler.measure([(start, stop)]), list(notes), stop - start, 10)
    return block


def _member(index: int, host: str, energy: dict | None, ended: str = "exited 0") -> dict:
    record = None if energy is None else {"energy": energy}
    return {"index": index, "hosts": [host], "ended": ended, "record": record}


def _cpu(watts: float) -> Source:
    source = Source("rapl:package-0", "CPU package", "counter", "a simulated RAPL counter")
    source.read_value = lambda clock: _counter(watts, clock)
    return source


def _gpu(watts: float) -> Source:
    source = Source("gpu0", "GPU board", "counter", "a simulated NVML counter", uuid="GPU-a")
    source.read_value = lambda clock: _counter(watts, clock)
    return source


def test_the_window_adds_each_instances_nodes_once_and_names_the_uncovered_time():
    """Instance 0 on node9 (a CPU package at 100 W and a GPU at 200 W) trains the whole
    100 s window; instance 1 on node10 (a CPU package at 60 W) only its last 80 s."""
    members = [
        _member(0, "node9", _member_energy([_cpu(100.0), _gpu(200.0)], 1000.0, 1100.0)),
        _member(1, "node10", _member_energy([_cpu(60.0)], 1020.0, 1100.0)),
    ]
    energy, warnings = window_energy.members_energy(members, 1000.0, 1100.0)
    assert energy["measured"] and energy["interval_s"] == pytest.approx(100.0)
    assert energy["joules"] == pytest.approx(300.0 * 100 + 60.0 * 80, rel=1e-3)
    assert energy["average_watts"] == pytest.approx(360.0, rel=1e-3)  # each node once
    assert energy["coverage"] == pytest.approx(0.8, abs=0.01)  # instance 1's 80 of 100 s
    (note,) = energy["notes"]
    assert note.startswith("instance 1 (node10): its readings cover its own timed run, 80")
    assert any(f.startswith("instance 1: below MLPerf-power quality") for f in warnings)
    assert "instance 0 (node9)" in energy["scope"] and "instance 1 (node10)" in energy["scope"]
    assert {s["instance"] for s in energy["sources"]} == {0, 1}
    watts, said = scoring.scored_power(energy)
    assert watts == pytest.approx(360.0, rel=1e-3) and said.startswith("measured: instance 0")


def test_a_member_without_energy_leaves_the_window_not_measured_naming_it():
    measured = _member_energy([_cpu(100.0)], 1000.0, 1010.0)
    off = {**measured, "measured": False, "reason": "power sampling was switched off"}
    for second, words in [
        (_member(1, "node10", None, "killed by SIGKILL"), "instance 1 (node10): no record (killed"),
        (_member(1, "node10", off), "instance 1 (node10): not measured (power sampling was"),
        (_member(1, "node9", measured), "instances 0 and 1 both ran on node9"),
    ]:
        members = [_member(0, "node9", measured), second]
        energy, _ = window_energy.members_energy(members, 1000.0, 1010.0)
        assert not energy["measured"] and energy["reason"].startswith(words), energy["reason"]
        assert scoring.scored_power(energy)[0] is None  # never a per-watt figure from part


def test_a_member_lacking_its_other_workers_energy_gives_no_per_watt_figure():
    lost = power.not_gathered(2, "energy", "a peer was lost")  # as run/energy.py notes it
    energy = _member_energy([_cpu(100.0)], 1000.0, 1010.0, [lost])
    summed, _ = window_energy.members_energy([_member(0, "node9", energy)], 1000.0, 1010.0)
    assert summed["measured"]
    watts, said = scoring.scored_power(summed)
    assert watts is None and "worker 1: energy not gathered" in said


# ----------------------------------------------------------------------------- each node


def _member_dirs(parent: Path, windows: list[tuple[float, float]]) -> list[Path]:
    """Instance i on node(9 + i), timed `windows[i]`: its note's path, the note written."""
    hosts = [f"node{9 + index}" for index in range(len(windows))]
    paths = []
    for note in member_notes(parent, windows, hosts):
        paths.append(parent / f"member-{note['index']}.json")
        paths[-1].write_text(json.dumps(note))
    return paths


def _as_logged(seconds: float) -> float:
    """A time as the window reads it back from an MLPerf log (time_ms / 1000): not always the
    same double (about 2 % of time.time() values), so the tests pass the window read back."""
    return seconds * 1000 / 1000


def _node_sampling(watts: float):
    """A node's sampler as its first task starts it: a package at `watts`, on the real clock."""
    source = Source("rapl:package-0", "CPU package", "power", "a simulated package",
                    read_value=lambda: watts)  # fmt: skip
    return power.PowerSampler([source], hz=200).start(), []


def test_each_node_is_sampled_over_the_whole_window_though_its_instance_ended_first(
    tmp_path, monkeypatch
):
    """Instance 0 (node9, 100 W) ends after a third of the window, instance 1 (node10,
    60 W) trains it all: node9's block still covers the whole window, and the window's
    energy is both nodes' over it, each once."""
    samplings = {9: _node_sampling(100.0), 10: _node_sampling(60.0)}  # before the window,
    began = time.time()  # as each node's first task starts its sampler before its instance
    time.sleep(0.6)
    ended = time.time()
    notes = _member_dirs(tmp_path, [(began, began + 0.2), (began, ended)])
    for node, sampling in samplings.items():
        monkeypatch.setenv("SLURMD_NODENAME", f"node{node}")
        window_energy.write_node(tmp_path, sampling, notes, 0.2, 200)
    began, ended = _as_logged(began), _as_logged(ended)
    energy, warnings = window_energy.nodes_energy(tmp_path, ["node9", "node10"], began, ended)
    assert energy["measured"] and energy["method"] == window_energy.NODE_METHOD
    assert energy["joules"] == pytest.approx(160.0 * (ended - began), rel=0.05)
    assert energy["average_watts"] == pytest.approx(160.0, rel=1e-3)
    assert energy["coverage"] > 0.95 and not warnings
    assert "node node9" in energy["scope"] and "node node10" in energy["scope"]


def test_a_node_that_wrote_no_window_leaves_the_members_records_to_count(tmp_path, monkeypatch):
    monkeypatch.setattr(window_energy, "NODES_WAIT_S", 0.2)
    began = time.time()
    sampling = _node_sampling(100.0)
    time.sleep(0.2)
    ended = time.time()
    notes = _member_dirs(tmp_path, [(began, ended), (began, ended)])
    monkeypatch.setenv("SLURMD_NODENAME", "node9")
    window_energy.write_node(tmp_path, sampling, notes, 0.2, 200)
    window = _as_logged(began), _as_logged(ended)
    energy, said = window_energy.nodes_energy(tmp_path, ["node9", "node10"], *window)
    assert energy is None and said == [
        "node node10 wrote no energy over the window: the members' own used"
    ]


def test_no_window_leaves_the_members_records_to_say_so_and_one_chief_assembles(tmp_path):
    from hpcai500_tf.run import instance_launch

    assert window_energy.nodes_energy(tmp_path, ["node9"], None, None) == (None, [])
    assert window_energy.nodes_energy(tmp_path, ["node9"], 5.0, None) == (None, [])
    assert instance_launch._claimed(tmp_path) and not instance_launch._claimed(tmp_path)


def test_a_node_waits_for_a_lost_instance_only_so_long(tmp_path, monkeypatch):
    """Instance 1's task was lost (no note ever comes): node9 stops waiting and says so."""
    monkeypatch.setattr(window_energy, "NODE_WAIT_MIN_S", 0.3)
    began = time.time()
    sampling = _node_sampling(100.0)
    time.sleep(0.2)
    notes = _member_dirs(tmp_path, [(began, time.time())])
    monkeypatch.setenv("SLURMD_NODENAME", "node9")
    waited = time.monotonic()
    window_energy.write_node(tmp_path, sampling, [*notes, tmp_path / "member-1.json"], 0.1, 200)
    assert time.monotonic() - waited < 5
    node = json.loads((tmp_path / "node-energy-node9.json").read_text())
    assert node["energy"]["measured"]
    assert "sampled until 1 of 2 instances had ended" in node["energy"]["notes"][-1]


# ----------------------------------------------------------------------------- a stop

CHILD = """\
import signal, sys, time
def stop(signum, frame):
    for each in (signal.SIGTERM, signal.SIGUSR1):  # as a stopping run: later ones ignored
        signal.signal(each, signal.SIG_IGN)
    print("child stopped by", signum, flush=True)
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGUSR1, stop)
print("child ready", flush=True)
time.sleep(60)
"""
TASK = """\
import os, signal, sys
from hpcai500_tf.run import slurm_task
code, by = slurm_task.run_instance([sys.executable, "-c", sys.argv[1]], None)
os.kill(os.getpid(), signal.SIGTERM)  # a late stop, as the task writes its note: held
print("task", code, by, flush=True)
sys.exit(code)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["TERM", "USR1"])
@pytest.mark.parametrize("whole_step", [True, False], ids=["every-process", "the-task-alone"])
def test_a_stop_to_the_task_reaches_its_instance_and_the_task_returns(whole_step, signum):
    """scancel signals every process of the step (the task and its child), and so does srun
    with the time limit's SIGUSR1; a signal to the task alone is passed on. Either way the
    child stops once and the task lives to return, a stop after its child ended held until
    it exits."""
    task = subprocess.Popen(
        [sys.executable, "-c", TASK, CHILD], env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, process_group=0,
    )  # fmt: skip
    assert task.stdout.readline().strip() == "child ready"
    if whole_step:
        os.killpg(task.pid, signum)
    else:
        task.send_signal(signum)
    began = time.monotonic()
    output, _ = task.communicate(timeout=30)
    assert time.monotonic() - began < 10
    assert task.returncode == 128 + signum, output
    assert output.splitlines() == [
        f"child stopped by {int(signum)}",
        f"task {128 + signum} {int(signum)}",
    ]


# ----------------------------------------------------------------------------- an ensemble


def _step_task(procid: int) -> dict[str, str]:
    """Task `procid` of a two-node, two-task step, as srun sets its variables."""
    return {
        "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid),
        "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    }  # fmt: skip


ENSEMBLE = ["train", "image_classification", "--preset", "tiny", "--no-tensorboard",
            "--power-hz", "0", "--instances", "2", "--ensemble"]  # fmt: skip


def test_an_ensembles_tasks_give_each_member_its_index_and_the_last_chief_its_record(
    tmp_path, monkeypatch, capsys
):
    """Each task's `train` (a stand-in here, that trains nothing) gets its member's index and
    the run's seed; the chief that ends last writes an ensemble's throughput record and says
    why it has no score (no member left a record)."""
    from hpcai500_tf.cli import main
    from hpcai500_tf.run import ensemble, slurm_task, throughput

    started = []
    monkeypatch.setattr(slurm_task, "run_instance", lambda command, env: started.append(command)
                        or (0, None))  # fmt: skip
    for procid in (0, 1):
        for name, value in _step_task(procid).items():
            monkeypatch.setenv(name, value)
        assert main([*ENSEMBLE, "--out", str(tmp_path)]) == 0
    for index, command in enumerate(started):
        settings = [command[i + 1] for i, part in enumerate(command) if part == "--set"]
        assert "training.seed=10" in settings and f"data.bootstrap_member={index}" in settings
    (path,) = tmp_path.glob("*-x2-77.0/throughput.json")
    data = throughput.load(path)
    rule = {**ensemble.RULE, "merging": ensemble.MERGING["image_classification"]}
    assert (data["form"], data["rule"], data["placement"]) == ("ensemble", rule, "slurm")
    assert [m["seed"] for m in data["members"]] == [10, 10]
    out = capsys.readouterr().out
    assert out.count("throughput record:") == 1  # the last chief's
    assert "no throughput score: " in out and "no instance wrote a record: nothing to score" in out


@pytest.mark.slow  # two tiny members side by side: about a minute on 2 loaded cores
def test_two_srun_tasks_train_an_ensemble_the_test_recomputes(tmp_path):
    """Two tasks of a simulated step (srun's variables, no Slurm), each a real member."""
    import numpy as np

    from hpcai500_tf import record
    from hpcai500_tf.data import bootstrap
    from hpcai500_tf.run import predictions, throughput

    tasks = [
        subprocess.Popen(
            [sys.executable, "-m", "hpcai500_tf.cli", *ENSEMBLE, "--out", str(tmp_path)],
            env={**os.environ, **_step_task(procid), "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for procid in (0, 1)
    ]
    said = [task.communicate(timeout=600)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], said
    (path,) = tmp_path.glob("*-x2-77.0/throughput.json")
    data = throughput.load(path)
    assert (data["form"], data["status"]) == ("ensemble", "completed")
    held = []
    for index, member in enumerate(data["members"]):
        run_dir = path.parent / member["run_dir"]
        rec = record.load(run_dir / "record.json")
        digest = rec["layers"]["L9"]["training_sample"]["digest"]
        assert digest == bootstrap.digest(bootstrap.draw(10, index, 256))
        held.append(predictions.load(run_dir, rec["quality"]["curve"][-1]["epoch"]))
    quality = float(np.mean(((held[0][0] + held[1][0]) / 2).argmax(1) == held[0][1]))
    one = throughput.score(path)
    assert one.quality == pytest.approx(quality)
    assert sum(one.summary() in text for text in said) == 1  # said by the last chief alone


class _FakeSampler:
    def __init__(self, boards: int):
        self.sources = [types.SimpleNamespace(part="GPU board") for _ in range(boards)]
        self.stopped = False

    def stop(self):
        self.stopped = True


@pytest.mark.parametrize("openable, measured", [(4, True), (1, False)])
def test_a_node_is_sampled_whole_not_as_its_first_tasks_one_gpu(monkeypatch, openable, measured):
    """Under srun --gpus-per-task=1 the sampling task (SLURM_LOCALID 0) has one GPU in
    CUDA_VISIBLE_DEVICES: the node's sampler looks past it at every GPU of the node; where a
    cgroup lets it open only its own (1 of 4), the node's energy is not measured, not one
    board counted as the node's four."""
    from hpcai500_tf.run import energy

    seen = {}

    def start(hz, environ):
        seen["env"] = {k: environ.get(k) for k in window_energy.NODE_VIEW_HIDES}
        seen["sampler"] = _FakeSampler(openable)
        return seen["sampler"], []

    monkeypatch.setattr(energy, "start_power_sampling", start)
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    sampler, notes = window_energy.node_sampling(10)
    assert seen["env"] == {"CUDA_VISIBLE_DEVICES": None, "HPCAI500_WORKER_GPUS": None}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"  # the task's own view is put back
    if measured:
        assert sampler is seen["sampler"] and notes == []
    else:
        assert sampler is None and seen["sampler"].stopped
        assert notes == ["this task reads 1 of the 4 GPU boards Slurm gave the node: its "
                         "energy is not measured"]  # fmt: skip


@pytest.mark.parametrize("listed", ["4,5,6,7", None])
def test_a_shared_nodes_sampler_reads_the_jobs_boards_alone(monkeypatch, listed):
    """On a node shared with other jobs, where no device cgroup keeps a task to its own
    boards, NVML opens all 8: the node's sampler reads the 4 Slurm lists as the job's, or,
    without that list, measures nothing rather than the other jobs' boards too."""
    from hpcai500_tf.run import energy

    views, samplers = [], []

    def start(hz, environ):
        views.append(environ.get("CUDA_VISIBLE_DEVICES"))
        chosen = environ.get("CUDA_VISIBLE_DEVICES")
        samplers.append(_FakeSampler(8 if chosen is None else len(chosen.split(","))))
        return samplers[-1], []

    monkeypatch.setattr(energy, "start_power_sampling", start)
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4")  # the task's own (--gpus-per-task=1)
    monkeypatch.delenv("SLURM_STEP_GPUS", raising=False)
    if listed:
        monkeypatch.setenv("SLURM_JOB_GPUS", listed)
    else:
        monkeypatch.delenv("SLURM_JOB_GPUS", raising=False)
    sampler, notes = window_energy.node_sampling(10)
    assert samplers[0].stopped  # the whole node's 8 boards: never sampled on
    if listed:
        assert views == [None, "4,5,6,7"] and sampler is samplers[1] and notes == []
    else:
        assert views == [None] and sampler is None
        assert notes == ["this task reads 8 GPU boards, more than the 4 Slurm gave the job "
                         "here, and Slurm's list of them does not single them out: its energy "
                         "is not measured"]  # fmt: skip
