"""A run seen in TensorBoard: its scalars, layers and score, and a profiler trace on request."""

import subprocess
import sys

import pytest

from hpcai500_tf import record
from hpcai500_tf.cli import main


def _scalar_tags(log_dir) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    events.Reload()
    tags = events.Tags()
    return {
        "tensors": {tag: [e.step for e in events.Tensors(tag)] for tag in tags["tensors"]},
        "plugins": set(events.PluginAssets("hparams")) | set(events.summary_metadata),
    }


def test_a_run_writes_its_scalars_layers_and_score(tf_tiny):
    path, rec = tf_tiny
    log_dir = path.parent / "tensorboard"
    assert rec["artifacts"]["tensorboard"] == str(log_dir)
    assert rec["status"] == "completed" and rec["quality"]["measured"]
    found = _scalar_tags(log_dir)
    tensors = found["tensors"]
    steps_per_epoch = (
        rec["timeline"]["epochs"][0]["examples"] // rec["layers"]["L6"]["global_batch"]
    )
    epochs = len(rec["timeline"]["epochs"])
    # Each epoch's last step is always written; the loss's steps count over the whole run.
    assert set(tensors["train/loss"]) >= {e * steps_per_epoch for e in range(1, epochs + 1)}
    for tag in ("train/learning_rate", "train/examples_per_second"):
        assert tensors[tag] == tensors["train/loss"]
    assert tensors["eval/quality"] == [p["epoch"] for p in rec["quality"]["curve"]]
    assert tensors["eval/target"] == tensors["eval/quality"]
    assert tensors["score/valid_flops"] == [epochs]
    assert "_hparams_/session_start_info" in found["plugins"]  # the layers, for the HParams table


# `report` in its own process: the page, whether TensorFlow got imported, and the per-step
# throughput the page read (its caption's count).
REPORT_SCRIPT = """
import pathlib, re, sys
from hpcai500_tf.cli import main
assert main(["report", sys.argv[1], "--out", sys.argv[2]]) == 0
pages = " ".join(page.read_text() for page in pathlib.Path(sys.argv[2]).glob("*.html"))
print(sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras")))
print(re.search(r"from TensorBoard [(]([0-9]+) values[)]", pages).group(1))
"""


def test_report_reads_a_runs_step_throughput_without_importing_tensorflow(tf_tiny, tmp_path):
    """TensorFlow's start-up (seconds, and its C++ notices on stderr on AVX-512 and AMX CPUs)
    is never paid to read the run's TensorBoard scalars."""
    path, _ = tf_tiny
    steps = _scalar_tags(path.parent / "tensorboard")["tensors"]["train/examples_per_second"]
    result = subprocess.run(
        [sys.executable, "-c", REPORT_SCRIPT, str(path.parent), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    imported, count = result.stdout.splitlines()[-2:]
    assert imported == "[]" and int(count) == len(set(steps)) > 0
    assert "oneDNN" not in result.stderr and "tensorflow" not in result.stderr.lower()


def test_profile_steps_capture_a_trace_of_those_steps(tmp_path):
    argv = ["train", "image_classification", "--preset", "tiny", "--out", str(tmp_path)]
    assert (
        main([*argv, "--set", "training.epochs=1", "--profile-steps", "2-3", "--no-tensorboard"])
        == 0
    )
    (path,) = tmp_path.glob("*/record.json")
    rec = record.load(path)
    traces = rec["artifacts"]["profile_trace"]
    assert traces and all(t.endswith(".xplane.pb") for t in traces)
    assert any("steps 2-3 were traced" in w for w in rec["warnings"])
    assert not list((path.parent / "tensorboard").glob("events.out.tfevents.*"))  # no scalars
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(traces[0], "rb") as handle:
        space.ParseFromString(handle.read())
    op_names = {
        plane.event_metadata[event.metadata_id].name
        for plane in space.planes
        for line in plane.lines
        for event in line.events
    }
    assert any("Conv2D" in name for name in op_names), sorted(op_names)[:20]


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ("10-99", "--profile-steps 10-99: outside the steps this run trains (1-16)"),
    ],
)
def test_a_profile_range_outside_the_run_is_one_line(tmp_path, capsys, steps, message):
    argv = ["train", "image_classification", "--preset", "tiny", "--out", str(tmp_path)]
    assert main([*argv, "--profile-steps", steps]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("steps", ["3-2", "x", "0-1"])
def test_a_malformed_profile_range_is_refused(steps, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "image_classification", "--profile-steps", steps])
    assert exit_.value.code == 2 and "--profile-steps" in capsys.readouterr().err
