"""The PyTorch side runs the one lifecycle (run/lifecycle.py): a stopped run resumes from its
checkpoint to a whole record, a damaged checkpoint or the other framework's resume is one line,
several workers train one run through torch.distributed (the launcher's and torchrun's), and
TensorBoard scalars and a torch.profiler trace are written as on the TensorFlow side. Every
PyTorch run is a process of its own, which never loads TensorFlow."""

import dataclasses
import json
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hpcai500_tf import record

from .conftest import copy_run
from .test_tensorboard import _scalar_tags

TINY = ["--preset", "tiny", "--power-hz", "0", "--set", "training.checkpoint_every=1"]


def train(*args: str, probe: str = "", timeout: int = 300) -> subprocess.CompletedProcess:
    """`hpcai500-tf train --framework pytorch ARGS` in a new process; `probe` runs first (the
    feeder process is spawned, so the call sits under a main guard)."""
    script = (
        "import sys\n"
        f"{probe}\n"
        "from hpcai500_tf.cli import main\n"
        "if __name__ == '__main__':\n"
        f"    sys.exit(main(['train', *{list(args)!r}]))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout
    )


STOP_BEFORE_EPOCH_3 = (
    "from hpcai500_tf.report import live\n"
    "shown = live.LiveView.on_epoch_start\n"
    "def epoch_start(self, epoch, epochs, steps):\n"
    "    if epoch == 3:\n"
    "        raise KeyboardInterrupt\n"
    "    shown(self, epoch, epochs, steps)\n"
    "live.LiveView.on_epoch_start = epoch_start\n"
)


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """A tiny PyTorch run of 3 epochs, interrupted as epoch 3 begins (as Ctrl-C would)."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("stopped")
    result = train(
        "image_classification", "--framework", "pytorch", *TINY, "--out", str(out),
        "--set", "training.epochs=3", probe=STOP_BEFORE_EPOCH_3,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    (path,) = out.glob("*/record.json")
    return path.parent


def test_a_stopped_pytorch_run_resumes_to_a_whole_record(torch_installed, stopped_run, tmp_path):
    run_dir = copy_run(stopped_run, tmp_path)
    stopped = record.load(run_dir / "record.json")
    assert stopped["status"] == "stopped" and len(stopped["timeline"]["epochs"]) == 2
    assert "the last checkpoint holds 2" in stopped["warnings"][0]
    state = json.loads((run_dir / "state.json").read_text())
    assert state["framework"] == "pytorch" and state["epochs_done"] == 2
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["ckpt-2.pt"]
    result = train("--resume", str(run_dir), "--power-hz", "0")  # its framework from its state
    assert result.returncode == 0, result.stderr[-2000:]
    done = record.load(run_dir / "record.json")
    assert done["status"] == "completed" and done["source"]["framework"] == "pytorch"
    assert [e["epoch"] for e in done["timeline"]["epochs"]] == [1, 2, 3]
    assert done["timeline"]["epochs"][:2] == stopped["timeline"]["epochs"]
    segments = done["timeline"]["segments"]
    assert len(segments) == 2 and segments[1]["start"] >= segments[0]["stop"]
    assert [c["epoch"] for c in done["artifacts"]["checkpoints_written"]] == [1, 2, 3]
    # One MLPerf log across both processes: a run_stop for each, epochs 1-3 once each.
    log = (run_dir / "mlperf.log").read_text()
    stops = [json.loads(line.split(":::MLLOG", 1)[1]) for line in log.splitlines()]
    epochs = [e["metadata"]["epoch_num"] for e in stops if e["key"] == "epoch_stop"]
    assert epochs == [1, 2, 3] and log.count('"key": "run_stop"') == 2
    # TensorBoard scalars, from both processes, by global step and epoch.
    tags = _scalar_tags(run_dir / "tensorboard")
    assert {"train/loss", "eval/quality", "score/valid_flops"} <= set(tags["tensors"])
    assert tags["tensors"]["eval/quality"] == [1, 2, 3]
    # Its report page, as a TensorFlow run's: the per-step throughput from those scalars.
    from hpcai500_tf.cli import main

    assert main(["report", str(run_dir), "--out", str(tmp_path / "report")]) == 0
    (page,) = (tmp_path / "report").glob(f"{run_dir.name}*.html")
    html = page.read_text()
    assert "pytorch" in html and "per-step throughput (TensorBoard events)" not in html


def test_a_damaged_pytorch_checkpoint_is_one_line_and_the_record_is_kept(
    torch_installed, stopped_run, tmp_path
):
    run_dir = copy_run(stopped_run, tmp_path)
    checkpoint = run_dir / "checkpoints" / "ckpt-2.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    before = (run_dir / "record.json").read_bytes()
    result = train("--resume", str(run_dir), "--power-hz", "0")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"hpcai500-tf: error: {checkpoint}: the checkpoint is damaged ("), line
    assert (run_dir / "record.json").read_bytes() == before


def _flip_a_weight_bit(checkpoint: Path) -> None:
    """One bit flipped in the middle of the first tensor's bytes (a zip member torch.save
    stores uncompressed): torch.load would read it as a wrong weight."""
    with zipfile.ZipFile(checkpoint) as archive:
        member = next(i for i in archive.infolist() if "/data/" in i.filename and i.file_size)
    data = bytearray(checkpoint.read_bytes())
    name_length, extra_length = struct.unpack_from("<HH", data, member.header_offset + 26)
    start = member.header_offset + 30 + name_length + extra_length
    data[start + member.file_size // 2] ^= 0x10
    checkpoint.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        lambda path: path.write_bytes(path.read_bytes()[:1000]),
        _flip_a_weight_bit,
    ],
    ids=["truncated", "a weight's bit flipped"],
)
def test_a_damaged_pytorch_checkpoint_is_refused_before_torch_or_the_data_process_starts(
    torch_installed, stopped_run, tmp_path, monkeypatch, capsys, damage
):
    """The resume's checks (run/state.py) read ckpt-N.pt whole in pure Python: nothing of
    the PyTorch side (torch, the trainer, its TensorFlow data process) is ever started."""
    from hpcai500_tf import backends
    from hpcai500_tf.cli import main

    def never(*args, **kwargs):
        raise AssertionError("the PyTorch side was started for a damaged checkpoint")

    pytorch = dataclasses.replace(backends.get("pytorch"), _load=never, _build_trainer=never)
    monkeypatch.setitem(backends._BACKENDS, "pytorch", pytorch)
    run_dir = copy_run(stopped_run, tmp_path)
    checkpoint = run_dir / "checkpoints" / "ckpt-2.pt"
    damage(checkpoint)
    assert main(["train", "--resume", str(run_dir), "--power-hz", "0"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"hpcai500-tf: error: {checkpoint}: the checkpoint is damaged ("), line


def test_a_checkpoint_with_more_updates_than_steps_is_refused_whole(
    torch_installed, stopped_run, tmp_path
):
    """The schedule's position (updates) cannot pass the steps taken: such a checkpoint was
    not written by this trainer, and resuming it would train at a rate from later in the run."""
    import torch

    run_dir = copy_run(stopped_run, tmp_path)
    checkpoint = run_dir / "checkpoints" / "ckpt-2.pt"
    state = torch.load(checkpoint, weights_only=True)
    assert state["updates"] == state["step"] > 0  # fp32 on the CPU skips no step
    state["updates"] = state["step"] + 1
    torch.save(state, checkpoint)
    before = (run_dir / "record.json").read_bytes()
    result = train("--resume", str(run_dir), "--power-hz", "0")
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    step = state["step"]
    assert line == (
        f"hpcai500-tf: error: {checkpoint}: holds {step + 1} updates applied in {step} steps: "
        "resume refused"
    )
    assert (run_dir / "record.json").read_bytes() == before


def test_resuming_with_the_other_framework_is_one_line(torch_installed, stopped_run, tmp_path):
    run_dir = copy_run(stopped_run, tmp_path)
    result = train("--resume", str(run_dir), "--framework", "tensorflow")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"hpcai500-tf: error: {run_dir}: it was trained with pytorch; resume it with "
        "--framework pytorch (or --resume alone)"
    )


def _two_worker_record(out: Path) -> dict:
    (path,) = out.glob("*/record.json")
    rec = record.load(path)
    assert rec["status"] == "completed" and rec["source"]["framework"] == "pytorch"
    assert rec["layers"]["L3"]["collective_implementation"] == "torch.distributed gloo"
    assert rec["layers"]["L3"]["workers"] == 2
    # Each worker reads its half of the data: two replicas' batches make a step.
    batch = rec["config"]["training"]["batch_per_replica"]
    assert rec["timeline"]["epochs"][0]["examples"] % (2 * batch) == 0
    return rec


def test_two_pytorch_workers_train_one_run_through_the_launcher(torch_installed, tmp_path):
    out = tmp_path / "runs"
    result = subprocess.run(
        ["timeout", "-k", "5", "240", sys.executable, "-m", "hpcai500_tf.cli", "train",
         "image_classification", "--framework", "pytorch", *TINY, "--out", str(out),
         "--workers", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    rec = _two_worker_record(out)
    assert rec["layers"]["L3"]["started_by"] == "launcher"
    assert (Path(rec["artifacts"]["run_dir"]) / "workers" / "worker-1.log").is_file()


def test_two_pytorch_workers_train_one_run_under_torchrun(torch_installed, tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this Python")
    out = tmp_path / "runs"
    result = subprocess.run(
        ["timeout", "-k", "5", "240", str(torchrun), "--standalone", "--nproc-per-node", "2",
         "-m", "hpcai500_tf.cli", "train", "image_classification",
         "--framework", "pytorch", *TINY, "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert _two_worker_record(out)["layers"]["L3"]["started_by"] == "torchrun"


def test_profile_steps_write_a_torch_profiler_trace(torch_installed, tmp_path):
    out = tmp_path / "runs"
    result = train(
        "image_classification", "--framework", "pytorch", *TINY, "--out", str(out),
        "--profile-steps", "2-3", "--no-tensorboard",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (path,) = out.glob("*/record.json")
    rec = record.load(path)
    (trace,) = rec["artifacts"]["profile_trace"]
    assert trace.endswith(".pt.trace.json")
    events = json.loads(Path(trace).read_text())["traceEvents"]
    assert any("conv" in str(event.get("name", "")).lower() for event in events)
    assert "train steps 2-3 were traced by torch.profiler, which slows them" in " ".join(
        rec["warnings"]
    )
    assert not list((path.parent / "tensorboard").glob("events.out.tfevents.*"))


def _tiny_trainer_probe(tmp_path: Path, body: str) -> dict:
    """`body` (Python, indented 8) run on a tiny TorchTrainer in a process of its own (no
    TensorFlow), which prints one JSON line last; that line, read."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, sys\n"
        "from hpcai500_tf import config\n"
        "from hpcai500_tf.run.options import RunOptions\n"
        "from hpcai500_tf.pytorch.train import TorchTrainer\n"
        "if __name__ == '__main__':  # the feeder process, spawned, imports this file\n"
        "    sys.modules['tensorflow'] = None\n"
        "    import torch\n"
        "    setup = config.prepare('image_classification', 'tiny', [])\n"
        "    trainer = TorchTrainer(setup, RunOptions())\n"
        "    try:\n" + body + "    finally:\n"
        "        trainer.close()\n"
    )
    result = subprocess.run(
        [sys.executable, str(probe)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_warm_up_step_leaves_a_resumed_schedule_where_it_was(torch_installed, tmp_path):
    """The warm-up step (before the timed run) is undone whole: weights, optimizer, loss scale
    and the step the learning-rate schedule reads, which a resume set from its checkpoint."""
    seen = _tiny_trainer_probe(
        tmp_path,
        "        trainer.step, trainer.updates = 5, 4\n"
        "        before = [p.detach().clone() for p in trainer.module.parameters()]\n"
        "        trainer.warm_up(checkpoints=True)\n"
        "        same = all(bool((a == b.detach()).all())\n"
        "                   for a, b in zip(before, trainer.module.parameters()))\n"
        "        print(json.dumps({'step': [trainer.step, trainer.updates], 'same': same}))\n",
    )
    assert seen == {"step": [5, 4], "same": True}


def test_a_step_skipped_for_an_overflow_does_not_move_the_schedule(torch_installed, tmp_path):
    """As Keras's schedule follows its inner optimizer's iterations, PyTorch's follows the
    updates applied: a float16 step whose gradients overflow (GradScaler skips it) trains the
    next step at the same rate. GradScaler on the CPU stands for CUDA's here."""
    seen = _tiny_trainer_probe(
        tmp_path,
        "        trainer.scaler = torch.amp.GradScaler('cpu', init_scale=2.0**15)\n"
        "        batch, finite = trainer._zero_batch(), trainer.loss_fn\n"
        "        trainer.loss_fn = lambda *a: finite(*a) * float('inf')\n"
        "        trainer.train_step(batch)\n"
        "        skipped = [trainer.step, trainer.updates, trainer.scaler.get_scale()]\n"
        "        trainer.loss_fn = finite\n"
        "        rates = []\n"
        "        for _ in range(2):\n"
        "            trainer.train_step(batch)\n"
        "            rates.append(trainer.learning_rate())\n"
        "        schedule = [trainer.schedule.rate(k) for k in range(3)]\n"
        "        print(json.dumps({'skipped': skipped, 'rates': rates, 'schedule': schedule,\n"
        "                          'now': [trainer.step, trainer.updates]}))\n",
    )
    assert seen["skipped"] == [1, 0, 2.0**14]  # a step taken, no update, the scale halved
    schedule = seen["schedule"]
    assert len(set(schedule)) == 3  # the tiny schedule's first rates differ: the test can fail
    assert seen["rates"] == schedule[:2]  # steps 2 and 3 train at updates 0 and 1's rates
    assert seen["now"] == [3, 2]


class _Pipe:
    def __init__(self, *replies):
        self.replies = list(replies)

    def recv(self):
        return self.replies.pop(0)


def test_bad_data_the_data_process_meets_mid_run_is_the_tensorflow_sides_words():
    """A sample the workload rejects mid-stream is bad data mid-run ("the input data failed
    mid-run", as a UserError inside TensorFlow's pipeline is); one at start-up stays a user
    error; any other read failure is a failed run naming the TensorFlow error."""
    from collections import deque

    from hpcai500_tf.errors import UserError
    from hpcai500_tf.pytorch.feeder import Feeder, FeederDataError, FeederError
    from hpcai500_tf.pytorch.train import TorchTrainer
    from hpcai500_tf.run.lifecycle import Failure

    feeder = object.__new__(Feeder)
    feeder._pending, feeder._closed = {}, set()
    feeder._pipe = _Pipe((3, "user_error", "x.tfrecord: sample 7: bad"), (None, "user_error", "no"))
    with pytest.raises(FeederDataError, match="sample 7: bad"):
        feeder._reply(3)
    with pytest.raises(UserError, match="no") as start_up:
        feeder._reply(None)
    assert not isinstance(start_up.value, FeederError)
    feeder._pending = {5: deque([("error", "reading data failed: DataLossError: corrupted")])}
    with pytest.raises(FeederError) as other:
        feeder._reply(5)
    trainer = object.__new__(TorchTrainer)
    trainer.workers = 1
    assert trainer.explain(FeederDataError("x: sample 7: bad")) == Failure(
        "data", "x: sample 7: bad"
    )
    assert trainer.explain(other.value) == Failure(
        "failed", "reading data failed: DataLossError: corrupted"
    )
    assert trainer.explain(ValueError("a defect")) is None
