"""Checkpoints by wall time: the cadence, resume from the end checkpoint (and from a run
directory written before the cadence key), the key's validation, and the running energy
integration a checkpoint takes (equal to the full one, its cost bounded by the new readings)."""

import copy
import itertools
import json
import random
import types
from pathlib import Path

import pytest

from hpcai500_tf import config, record
from hpcai500_tf.cli import main
from hpcai500_tf.energy import sampler as power
from hpcai500_tf.energy.integrate import RunningEnergy, energy_over
from hpcai500_tf.energy.sources import Source
from hpcai500_tf.engine import run
from hpcai500_tf.errors import UserError
from hpcai500_tf.mlperf.mllog import MLLogger
from hpcai500_tf.run import lifecycle
from hpcai500_tf.run.checkpoints import checkpoint_due
from hpcai500_tf.run.directory import RunDirectory
from hpcai500_tf.run.progress import Progress, fingerprint

from .conftest import copy_run
from .test_train import StopBeforeEpoch

ONLY_AT_END = ["training.checkpoint_every=0", "training.checkpoint_minutes=0"]


def _training(*overrides: str) -> config.TrainingConfig:
    return config.prepare("image_classification", "tiny", list(overrides)).training


# ------------------------------------------------------------------------ the cadence


def test_a_checkpoint_is_due_after_the_interval_or_the_epoch_count_and_always_at_the_end():
    by_time = _training("training.epochs=5", "training.checkpoint_every=0",
                        "training.checkpoint_minutes=2")  # fmt: skip
    assert not checkpoint_due(by_time, 1, 119.9)
    assert checkpoint_due(by_time, 1, 120.0)
    assert checkpoint_due(by_time, 5, 0.0)  # the last epoch, whatever the time
    only_end = _training("training.epochs=5", *ONLY_AT_END)
    assert [e for e in range(1, 6) if checkpoint_due(only_end, e, 1e9)] == [5]
    both = _training("training.epochs=7", "training.checkpoint_every=3",
                     "training.checkpoint_minutes=0")  # fmt: skip
    assert [e for e in range(1, 8) if checkpoint_due(both, e, 0.0)] == [3, 6, 7]


class IdleTrainer:
    """A trainer that trains nothing: each step moves a fake clock on by `seconds`, each
    checkpoint is an empty index file."""

    framework, workers, rank, global_batch, steps_per_epoch = "tensorflow", 1, 0, 256, 1
    workload = types.SimpleNamespace(measures_quality=False)

    def __init__(self, seconds: float):
        self.now, self.seconds, self.written = 0.0, seconds, []

    def train_batches(self, epochs_done, batches_done=0):
        return itertools.repeat(None)

    def train_step(self, batch, vote=None):
        self.now += self.seconds
        return 1.0

    def loss_value(self, loss):
        return loss

    def write_checkpoint(self, prefix, epochs_done, batches_done=0):
        prefix.with_name(prefix.name + ".index").write_text("")
        self.written.append(epochs_done)
        return prefix


def _idle_run(tmp_path, *overrides: str, run_dir=True) -> lifecycle.Run:
    setup = config.prepare("image_classification", "tiny", list(overrides))
    trainer = IdleTrainer(seconds=25.0)
    return lifecycle.Run(
        setup, trainer, RunDirectory(tmp_path) if run_dir else None, False,
        Progress(config_fingerprint="x"), MLLogger(None), clock=lambda: trainer.now,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("minutes", "every", "written"),
    [(1.0, 0, [3, 6, 8]), (0.0, 0, [8]), (0.0, 3, [3, 6, 8]), (0.5, 4, [2, 4, 6, 8])],
)
def test_the_loop_writes_checkpoints_by_wall_time_at_epoch_ends_and_at_the_end(
    tmp_path, minutes, every, written
):
    """25 s epochs on a fake clock: with 1 minute, epochs 3 (75 s) and 6 (75 s after it)."""
    one = _idle_run(tmp_path, "training.epochs=8", f"training.checkpoint_every={every}",
                    f"training.checkpoint_minutes={minutes}")  # fmt: skip
    progress = lifecycle.train_epochs(one)
    assert [c["epoch"] for c in progress.checkpoints] == written
    state = json.loads((tmp_path / "state.json").read_text())
    assert [c["epoch"] for c in state["checkpoints"]] == written and state["epochs_done"] == 8
    assert all(c["write_s"] >= 0 for c in state["checkpoints"])
    assert state["framework"] == "tensorflow"
    # Only the last checkpoint is kept, under the prefix the state names.
    assert Path(state["checkpoint"]).name == "ckpt-8"
    assert {p.name.split(".")[0] for p in (tmp_path / "checkpoints").iterdir()} == {"ckpt-8"}


def test_no_run_directory_writes_no_checkpoint(tmp_path):
    """A worker other than the chief trains with no run directory: it writes nothing."""
    one = _idle_run(tmp_path, "training.epochs=8", run_dir=False)
    assert lifecycle.train_epochs(one).epochs_done == 8
    assert one.trainer.written == [] and not (tmp_path / "checkpoints").exists()


# ------------------------------------------------------------------------ resume


def test_a_run_checkpointed_only_at_its_end_rebuilds_its_lost_record(tmp_path, capsys):
    setup = config.prepare("image_classification", "tiny", ONLY_AT_END)
    original, path = run.run_benchmark(setup, None, tmp_path, power_hz=0)
    assert original["status"] == "completed"
    assert original["artifacts"]["checkpoint_cadence"] == "after the last epoch only"
    assert [c["epoch"] for c in original["artifacts"]["checkpoints_written"]] == [2]
    state = json.loads((path.parent / "state.json").read_text())
    assert state["epochs_done"] == 2 and [c["epoch"] for c in state["checkpoints"]] == [2]
    path.unlink()
    assert main(["train", "--resume", str(path.parent), "--power-hz", "0"]) == 0
    rebuilt = record.load(path)
    assert rebuilt["status"] == "completed"
    assert rebuilt["timeline"]["epochs"] == original["timeline"]["epochs"]
    assert rebuilt["quality"]["curve"] == original["quality"]["curve"]
    capsys.readouterr()
    assert main(["train", "--resume", str(path.parent), "--power-hz", "0"]) == 2
    assert "already finished all its epochs" in capsys.readouterr().err


def test_a_run_stopped_before_any_checkpoint_says_it_cannot_be_resumed(tmp_path):
    setup = config.prepare("image_classification", "tiny", ["training.epochs=3", *ONLY_AT_END])
    stopped, _ = run.run_benchmark(setup, None, tmp_path, view=[StopBeforeEpoch(3)], power_hz=0)
    assert stopped["status"] == "stopped"
    assert any("no checkpoint was written yet" in w for w in stopped["warnings"])


def test_a_run_stopped_after_a_wall_time_checkpoint_resumes_from_it(tmp_path):
    by_time = [
        "training.epochs=3",
        "training.checkpoint_every=0",
        "training.checkpoint_minutes=1e-6",
    ]
    setup = config.prepare("image_classification", "tiny", by_time)
    stopped, path = run.run_benchmark(setup, None, tmp_path, view=[StopBeforeEpoch(3)], power_hz=0)
    assert stopped["status"] == "stopped" and stopped["artifacts"]["checkpoint_cadence"] == (
        "every 1e-06 min of wall time (at an epoch's end), and after the last epoch"
    )
    assert main(["train", "--resume", str(path.parent), "--power-hz", "0"]) == 0
    done = record.load(path)
    assert done["status"] == "completed" and len(done["timeline"]["segments"]) == 2
    assert [c["epoch"] for c in done["artifacts"]["checkpoints_written"]] == [1, 2, 3]


def test_a_run_directory_from_before_the_cadence_key_still_resumes(tf_tiny, tmp_path):
    """config.json without checkpoint_minutes, state.json without its checkpoint list and the
    checkpoint under the old fixed prefix `ckpt`: --resume alone rebuilds the record."""
    run_dir = copy_run(tf_tiny[0].parent, tmp_path)  # the session's finished tiny run
    path = run_dir / "record.json"
    saved = json.loads((run_dir / "config.json").read_text())
    del saved["config"]["training"]["checkpoint_minutes"]
    (run_dir / "config.json").write_text(json.dumps(saved))
    state = json.loads((run_dir / "state.json").read_text())
    for old in (run_dir / "checkpoints").iterdir():
        old.rename(old.with_name("ckpt" + old.name[len("ckpt-2") :]))
    del state["checkpoints"]
    state["checkpoint"] = str(Path(state["checkpoint"]).with_name("ckpt"))
    state["config_fingerprint"] = fingerprint(saved["config"])
    (run_dir / "state.json").write_text(json.dumps(state))
    path.unlink()
    assert main(["train", "--resume", str(run_dir), "--power-hz", "0"]) == 0
    rebuilt = record.load(path)
    assert (
        rebuilt["status"] == "completed"
        and "checkpoint_minutes" not in rebuilt["config"]["training"]
    )
    assert rebuilt["artifacts"]["checkpoint_cadence"].startswith("every 10 min of wall time")


# ------------------------------------------------------------------------ the config key


@pytest.mark.parametrize("value", ["-1", "10081", "'ten'", "true", "nan", "[1]"])
def test_a_bad_checkpoint_interval_is_one_line_naming_the_key(value, capsys):
    with pytest.raises(UserError, match=r"^config: 'training\.checkpoint_minutes' must be "):
        config.prepare("image_classification", "tiny", [f"training.checkpoint_minutes={value}"])
    assert main(["train", "image_classification", "--preset", "tiny",
                 "--set", f"training.checkpoint_minutes={value}"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'training.checkpoint_minutes'" in err, err


def test_a_config_saved_before_the_key_loads_with_its_default():
    setup = config.prepare("image_classification", "tiny", ["training.checkpoint_minutes=3"])
    old = copy.deepcopy(setup.config)
    del old["training"]["checkpoint_minutes"]
    assert config.setup_from(setup.benchmark, "tiny", old).training.checkpoint_minutes == 10.0
    assert setup.training.checkpoint_minutes == 3.0
    del old["training"]["checkpoint_every"]  # a key without a default is still required
    with pytest.raises(UserError, match="missing key 'training.checkpoint_every'"):
        config.setup_from(setup.benchmark, "tiny", old)


# ------------------------------------------------------------------------ running energy


class CountingList(list):
    """A list that counts the items read from it by index."""

    reads = 0

    def __getitem__(self, index):
        self.reads += 1 if isinstance(index, int) else len(range(*index.indices(len(self))))
        return super().__getitem__(index)


def _readings(kind: str, count: int, spacing: float, seed: int) -> list[tuple[float, float]]:
    """Jittered readings from t = 100 with occasional gaps (some beyond the gap limit), and
    for a counter a fall now and then (a wrap, or a fault where no range is known)."""
    rng = random.Random(seed)
    t, value, readings = 100.0, 5.0, []
    for _ in range(count):
        t += spacing * rng.uniform(0.5, 1.5) * (rng.choice([1] * 30 + [4, 25]))
        if kind == "power":
            value = rng.uniform(50.0, 400.0)
        else:
            value = (value + rng.uniform(0.0, 40.0)) % 1000.0 if rng.random() > 0.01 else 0.0
        readings.append((t, value))
    return readings


@pytest.mark.parametrize(
    ("kind", "wrap", "spacing"),
    [
        ("power", None, 0.1),
        ("counter", 1000.0, 0.1),
        ("counter", None, 0.1),
        ("power", None, 1.0),
        ("counter", None, 3.0),
    ],  # fmt: skip
)
def test_the_running_integration_equals_the_full_one_at_every_checkpoint(kind, wrap, spacing):
    """At 10 Hz the sums are the full integration's to the bit; a source read every second or
    slower (a gap limit above 2 s) takes the full integration itself."""
    everything = _readings(kind, 3000, spacing, seed=7)
    start = everything[40][0] - spacing / 3  # inside a pair: its part from start counts
    readings, running = [], RunningEnergy(kind, start, wrap)
    for chunk in range(0, len(everything), 250):
        readings += everything[chunk : chunk + 250]
        stop = readings[-1][0] + (spacing if chunk % 500 else 0.0)  # now, or at a reading
        assert running.update(readings, stop) == energy_over(readings, kind, [(start, stop)], wrap)


def test_a_checkpoints_integration_reads_only_the_new_readings():
    everything = _readings("power", 20_000, 0.1, seed=3)
    readings, running = CountingList(), RunningEnergy("power", everything[0][0], None)
    for chunk in range(0, len(everything), 1000):
        readings.extend(everything[chunk : chunk + 1000])
        readings.reads = 0
        measured = running.update(readings, readings[-1][0])
        readings.reads -= 1  # the test's own read of the last stamp
        assert readings.reads <= 2 * 1000  # each new reading, and the one before it once
    assert measured == energy_over(list(readings), "power", [(everything[0][0], everything[-1][0])])


def test_the_samplers_checkpoint_energy_is_its_full_measure_over_the_same_span():
    now = [1000.0]
    board = Source("gpu0", "GPU board", "power", "fake", read_value=lambda: 100.0 + now[0] % 7)
    package = Source("rapl:package-0", "CPU package", "counter", "fake", wrap_j=500.0,
                     read_value=lambda: (40.0 * (now[0] - 1000.0)) % 500.0)  # fmt: skip
    sampler = power.PowerSampler([board, package], hz=10, clock=lambda: now[0])
    start = 1000.05
    for checkpoint in range(3):
        for _ in range(50):
            sampler.sample_once()
            now[0] += 0.1
        stop, so_far = sampler.measure_so_far(start)
        assert stop == now[0] and all(t <= stop for r in sampler.readings.values() for t, _ in r)
        assert so_far == sampler.measure([(start, stop)])
        assert so_far[0]["samples"] == 51 * (checkpoint + 1) - 1  # all but the one before start
