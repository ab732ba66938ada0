"""tools/compare_frameworks.sh's two command lines, with a fake hpcai500-tf (it notes its
arguments and writes an empty record) and a fake nvidia-smi: on CPUs TensorFlow on stock
layers and one PyTorch process; on a GPU node both sides on every GPU this process may use,
TensorFlow with the kernels a real run uses there and PyTorch one process per GPU. The real
demo on CPUs is tests/test_pytorch_runner.py's."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE_CLI = """#!/bin/sh
echo "$*" >> "$FAKE_LOG"
if [ "$1" = train ]; then
  while [ "$#" -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
  mkdir -p "$out/run" && echo '{}' > "$out/run/record.json"
fi
"""


def _compare(tmp_path: Path, gpus: int | None, **env: str) -> list[str]:
    """The fake hpcai500-tf's command lines (after `train image_classification`)."""
    venv, bin_dir = tmp_path / "venv", tmp_path / "bin"
    (venv / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    (venv / "bin" / "hpcai500-tf").write_text(FAKE_CLI)
    (venv / "bin" / "hpcai500-tf").chmod(0o755)
    if gpus is not None:
        lines = "".join(
            f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d})\\n" for i in range(gpus)
        )
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '{lines}'\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    log, out = tmp_path / "commands", tmp_path / "out"
    environment = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    environment |= {"VENV": str(venv), "FAKE_LOG": str(log), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    result = subprocess.run(
        ["bash", str(ROOT / "tools" / "compare_frameworks.sh"), "smoke", str(out)],
        capture_output=True, text=True, env=environment | env, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    trains = [line for line in log.read_text().splitlines() if line.startswith("train ")]
    return [
        line.replace(str(out), "OUT").removeprefix("train image_classification ") for line in trains
    ]


def test_on_cpus_tensorflow_runs_stock_layers_and_pytorch_one_process(tmp_path):
    assert _compare(tmp_path, None) == [
        "--preset smoke --out OUT/tensorflow --set model.kernels=stock",
        "--framework pytorch --preset smoke --out OUT/pytorch",
    ]


@pytest.mark.parametrize(
    "visible, workers",
    [(None, 8), ("0,1,2,3", 4), ("5", 1), ("2,3,-1,4", 2)],
    ids=["all", "four", "one", "up-to-a-negative-entry"],
)
def test_on_an_8_gpu_node_both_sides_use_every_gpu_this_process_may(tmp_path, visible, workers):
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    processes = f" --workers {workers}" if workers > 1 else ""
    assert _compare(tmp_path, 8, **env) == [
        "--preset smoke --out OUT/tensorflow",  # the GPU kernels a real run uses
        f"--framework pytorch --preset smoke --out OUT/pytorch{processes}",
    ]


def test_gpus_hidden_by_cuda_visible_devices_leave_the_cpu_form(tmp_path):
    assert _compare(tmp_path, 8, CUDA_VISIBLE_DEVICES="-1")[0].endswith("model.kernels=stock")
