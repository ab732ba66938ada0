"""benchmarks/step_profile.py's split of the traced window by how many ops ran, and
benchmarks/layers_vs_pytorch.py run end to end at batch 1 (both frameworks' ResNet-50 at
224x224, each layer timed once: about 15 s on 2 cores)."""

import importlib.util
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
