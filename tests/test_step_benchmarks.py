"""benchmarks/step_profile.py's split of the traced window by how many ops ran, and
benchmarks/layers_vs_pytorch.py run end to end at batch 1 (both frameworks' ResNet-50 at
224x224, each layer timed once: about 15 s on 2 cores), and benchmarks/step_vs_ceiling.py's
share of the ceiling, from given rounds and (slow) measured end to end."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_occupancy_splits_the_window_by_how_many_ops_ran():
    occupancy = _script("step_profile").occupancy
    ps = 10**12  # the trace's picoseconds per second
    # 0-2 s one op, 1-3 s another (two side by side 1-2 s), nothing 3-4 s, a third 4-5 s
    spans = occupancy([(0, 2 * ps), (1 * ps, 3 * ps), (4 * ps, 5 * ps)])
    assert spans == pytest.approx({"none": 1.0, "one": 3.0, "two or more": 1.0})
    assert occupancy([]) == {"none": 0, "one": 0, "two or more": 0}


def test_layers_vs_pytorch_compares_every_layer_shape_of_both_models():
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "layers_vs_pytorch.py"), "--batch", "1",
         "--repeats", "1", "--rounds", "1", "--precision", "fp32"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith(("conv ", "bn+relu "))]
    assert len(rows) == 35  # ResNet-50's unique convolutions (23) and batch norms (12)
    assert "all layers: TensorFlow" in result.stdout


def test_step_vs_ceiling_divides_each_rounds_step_rate_by_the_ceiling_beside_it(
    capsys, monkeypatch
):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # its sibling modules, as when run
    report = _script("step_vs_ceiling").report
    rounds = [
        {"step": {"flops": 8e11, "seconds": 2.0}, "ceiling": {"conv_ceiling": 1e12}},
        {"step": {"flops": 8e11, "seconds": 1.0}, "ceiling": {"conv_ceiling": 2e12}},
        {"step": {"flops": 8e11, "seconds": 4.0}, "ceiling": {"conv_ceiling": 1e12}},
    ]
    row = report("mixed", rounds)
    assert row["ceiling_dtype"] == "bf16" and row["shares"] == pytest.approx([0.4, 0.4, 0.2])
    assert row["median_share"] == pytest.approx(0.4)  # not 400 / 1000 of the medians' ratio
    out = capsys.readouterr().out
    assert "share 40.0 %; per round 40.0 40.0 20.0" in out and "bf16 conv ceiling" in out


@pytest.mark.slow  # two fresh TensorFlow processes: about half a minute on 2 cores
def test_step_vs_ceiling_measures_both_in_one_run(tmp_path):
    out = tmp_path / "shares.json"
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "step_vs_ceiling.py"), "--batch", "2",
         "--image-size", "32", "--steps", "1", "--warmup", "1", "--rounds", "1",
         "--precisions", "fp32", "--conv-batch", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["step_flops"] > 0 and row["conv_ceilings"][0] > 0
    (seconds,) = row["step_seconds"]
    share = row["step_flops"] / seconds / row["conv_ceilings"][0]
    assert row["median_share"] == pytest.approx(share)
    assert result.stdout.startswith("cpu: ") and "fp32 conv ceiling" in result.stdout


@pytest.mark.parametrize("script", ["step_vs_ceiling", "train_step_vs_pytorch"])
def test_a_step_script_refuses_a_count_below_one_in_one_line(script):
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{script}.py"), "--rounds", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].endswith("'0' is not a whole number of at least 1")
