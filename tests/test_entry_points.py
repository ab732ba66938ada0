"""Every entry point, on bad input, in a clean environment: exactly one line on stderr, the
project's own, whatever TensorFlow's native libraries print while they load.

TensorFlow prints its oneDNN notice (and absl's pre-initialisation line) at import only where
oneDNN is on, by default on AVX-512 and AMX CPUs but not on AVX2-only ones. The environment
here turns oneDNN on (TF_ENABLE_ONEDNN_OPTS=1), so that TensorFlow has something to print on
every CPU kind; `test_tensorflow_prints_at_start_up_in_this_environment` checks that premise.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
CLI = [PYTHON, "-m", "hpcai500_tf.cli"]


def clean_environment(home: Path, **extra: str) -> dict:
    """What a user's shell gives: a PATH and a HOME, none of TensorFlow's or Keras's settings
    but oneDNN on (see the module's docstring)."""
    return {"PATH": os.environ["PATH"], "HOME": str(home), "TF_ENABLE_ONEDNN_OPTS": "1", **extra}


def run(command: list[str], home: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        command,
        cwd=ROOT,
        env=clean_environment(home, **extra),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_tensorflow_prints_at_start_up_in_this_environment(tmp_path):
    """The premise of the one-line tests: a bare `import tensorflow` writes to stderr here."""
    result = run([PYTHON, "-c", "import tensorflow"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    if not result.stderr.strip():
        pytest.skip(
            "TensorFlow prints nothing at import on this CPU even with oneDNN on: the one-line "
            "tests below still run, but cannot show that its start-up lines are kept away"
        )


def bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """Each entry point with one bad input: the command and the start of its one line."""
    missing = str(tmp_path / "missing")
    out = str(tmp_path / "out")
    taken = tmp_path / "taken.json"  # written by the test: gpu_check never overwrites it
    tools = ROOT / "tools"
    tiny_imagenet = [
        *("image_classification", "--preset", "tiny", "--set=data.source=imagenet"),
        *("--data", missing, "--out", out),
    ]
    return {
        # TensorFlow loaded, then the data directory found missing
        "train": ([*CLI, "train", *tiny_imagenet], ""),
        # the same in the launcher's worker processes
        "train --workers": ([*CLI, "train", *tiny_imagenet, "--workers", "2"], ""),
        "train (unknown benchmark)": ([*CLI, "train", "no_such_benchmark"], ""),
        "train (unknown flag)": ([*CLI, "train", "image_classification", "--no-such-flag"], ""),
        "flops": ([*CLI, "flops", "image_classification", "--preset", "no_such_preset"], ""),
        "roofline": ([*CLI, "roofline", "--quick", "--record", missing], ""),
        "score": ([*CLI, "score", missing], ""),
        "rank": ([*CLI, "rank", missing], ""),
        "compare": ([*CLI, "compare", missing, missing], ""),
        "scaling": ([*CLI, "scaling", missing], ""),
        "report": ([*CLI, "report", missing, "--out", out], ""),
        "import-mlperf": ([*CLI, "import-mlperf", missing], ""),
        "power": ([*CLI, "power", "--seconds", "0"], ""),
        "sysinfo": ([*CLI, "sysinfo", "--no-such-flag"], ""),
        # the PyTorch runner: its TensorFlow-side feeder process finds the data missing
        "train --framework pytorch": (
            [*CLI, "train", "--framework", "pytorch", *tiny_imagenet],
            "",
        ),
        "make_imagenet_tfrecords": (
            [PYTHON, str(tools / "make_imagenet_tfrecords.py"), missing, out],
            "make_imagenet_tfrecords: error:",
        ),
        "make_extreme_weather": (
            [
                PYTHON,
                str(tools / "make_extreme_weather.py"),
                out,
                *("--years", "1979", "--samples", "0"),
            ],
            "make_extreme_weather: error:",
        ),
        "gpu_check": ([PYTHON, str(tools / "gpu_check.py"), "--out", str(taken)], "gpu_check:"),
    }


CASES = list(bad_inputs(Path("/nonexistent")))


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_on_stderr(case, tmp_path):
    command, prefix = bad_inputs(tmp_path)[case]
    (tmp_path / "taken.json").write_text("{}")
    result = run(command, tmp_path / "home")
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1, f"{case}: expected one line on stderr, got:\n{result.stderr[-3000:]}"
    assert lines[0].startswith(prefix or "hpcai500-tf"), lines[0]
    assert "Traceback" not in result.stderr


def test_bad_data_is_found_before_the_native_kernels_are_built(tmp_path):
    """A missing data directory is said before the native batch norm is compiled (about 7 s
    on a 2-core CPU, on first use in a fresh home)."""
    command, _ = bad_inputs(tmp_path)["train"]
    home = tmp_path / "home"
    result = run([*command, "--set=model.kernels=cpu-native-batch-norm"], home)
    assert result.returncode == 2 and "data directory not found" in result.stderr
    assert not (home / ".cache" / "hpcai500-tf" / "native").exists()


def test_tensorflow_logs_reach_a_user_who_asks_for_them(tmp_path):
    """TF_CPP_MIN_LOG_LEVEL set by the user below 2: TensorFlow's lines come through, and the
    project's error line is still the last one."""
    bare = run([PYTHON, "-c", "import tensorflow"], tmp_path, TF_CPP_MIN_LOG_LEVEL="0")
    if not bare.stderr.strip():
        pytest.skip("TensorFlow prints nothing at import on this CPU, even at log level 0")
    command, _ = bad_inputs(tmp_path)["train"]
    result = run(command, tmp_path / "home", TF_CPP_MIN_LOG_LEVEL="0")
    lines = result.stderr.splitlines()
    assert result.returncode == 2
    assert len(lines) > 1 and lines[-1].startswith("hpcai500-tf: error:"), result.stderr


def test_a_keras_backend_other_than_tensorflow_is_refused_in_one_line(tmp_path):
    result = run([*CLI, "sysinfo", "--json"], tmp_path, KERAS_BACKEND="jax")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "hpcai500-tf: error: KERAS_BACKEND=jax: hpcai500-tf runs Keras on TensorFlow; unset "
        "KERAS_BACKEND or set it to tensorflow"
    ]


def test_keras_runs_on_tensorflow_whatever_keras_json_says(tmp_path):
    """A machine prepared for JAX (~/.keras/keras.json) still runs Keras on TensorFlow."""
    (tmp_path / ".keras").mkdir()
    (tmp_path / ".keras" / "keras.json").write_text(json.dumps({"backend": "jax"}))
    script = (
        "from hpcai500_tf.tensorflow_import import import_tensorflow; import_tensorflow(); "
        "import keras; print(keras.backend.backend())"
    )
    result = run([PYTHON, "-c", script], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["tensorflow"]
    assert result.stderr == ""
