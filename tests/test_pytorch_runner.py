"""The PyTorch runner (`hpcai500-tf train --framework pytorch`, hpcai500_tf/pytorch/): it
never shares a process with TensorFlow, its data come from the TensorFlow feeder process, it
refuses a torch it cannot use in one line, and the two-framework demo fails loudly."""

import contextlib
import json
import os
import stat
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from hpcai500_tf import record
from hpcai500_tf.errors import UserError
from hpcai500_tf.pytorch import build as torch_build
from hpcai500_tf.pytorch.feeder import Feeder

from .test_data import IMAGENET_FIXTURE_SETTINGS, imagenet_dir  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[1]

VENV = Path(sys.executable).parent.parent  # the environment running these tests


def run_runner(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpcai500_tf.cli", "train", "--framework", "pytorch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_demo(out: Path, venv: Path, timeout: int) -> subprocess.CompletedProcess:
    """tools/compare_frameworks.sh on the tiny preset, with the commands of `venv`."""
    return subprocess.run(
        ["bash", str(ROOT / "tools" / "compare_frameworks.sh"), "tiny", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "VENV": str(venv)},
        timeout=timeout,
    )


def test_the_demo_trains_tiny_in_both_frameworks_and_only_the_framework_differs(
    torch_installed, tmp_path
):
    """tools/compare_frameworks.sh end to end. The runner's process refuses to load
    TensorFlow (its data come from the feeder process), so the triton crash cannot come back
    unnoticed with any torch build, CPU-only ones included."""
    out = tmp_path / "demo"
    result = run_demo(out, VENV, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (tf_path,) = (out / "tensorflow").glob("*/record.json")
    (torch_path,) = (out / "pytorch").glob("*/record.json")
    tf_record, torch_record = record.load(tf_path), record.load(torch_path)
    assert torch_record["source"]["framework"] == "pytorch"
    # The demo runs TensorFlow on stock layers, as PyTorch runs on its own.
    assert (
        tf_record["layers"]["L7"]["kernels"] == torch_record["layers"]["L7"]["kernels"] == "stock"
    )
    assert torch_record["layers"]["L5"]["framework_build"].startswith("torch ")
    assert (torch_path.parent / "mlperf.log").read_text().count(":::MLLOG") > 20
    comparison = json.loads((out / "comparison.json").read_text())
    tf_l4, torch_l4 = tf_record["layers"]["L4"], torch_record["layers"]["L4"]
    # A CUDA build of torch (PyPI's default) differs from tensorflow-cpu in L4 too, truly: it
    # ships CUDA libraries; and where TensorFlow leaves its oneDNN operations off (AVX2-only
    # CPUs, e.g. AMD Zen 3) so does `onednn`. Nothing else may differ.
    l4_fields = {"cuda_build", "cuda_version", "cudnn_version"} if torch_l4["cuda_build"] else set()
    l4_fields |= {"onednn"} if tf_l4["onednn"] != torch_l4["onednn"] else set()
    if l4_fields:
        assert comparison["differing_layers"] == ["L4", "L5"], comparison["differences"]
        assert {d["field"] for d in comparison["differences"] if d["layer"] == "L4"} <= l4_fields
    else:
        assert comparison["valid_single_layer_comparison"], comparison["verdict"]
        assert comparison["differing_layers"] == ["L5"], comparison["differences"]
    # Both runners saw the same data: the same number of examples in every epoch.
    assert [e["examples"] for e in tf_record["timeline"]["epochs"]] == [
        e["examples"] for e in torch_record["timeline"]["epochs"]
    ]
    # The two counters agree exactly on convolutions and matrix products (forward and both
    # gradients); TensorFlow also counts the elementwise ops of weight decay, the update and,
    # on the stock layers the demo runs, Keras' batch norm (4.5 % of the tiny preset's count;
    # TensorFlow's fused batch-norm kernel has no count).
    tf_ops, torch_ops = (
        rec["flops"]["by_op_type_per_example"] for rec in (tf_record, torch_record)
    )
    tf_dense = sum(v for k, v in tf_ops.items() if k.startswith(("Conv2D", "MatMul")))
    torch_dense = sum(v for k, v in torch_ops.items() if "conv" in k or "mm" in k)
    assert tf_dense == pytest.approx(torch_dense, rel=1e-9)
    ratio = (
        torch_record["flops"]["per_example_training"] / tf_record["flops"]["per_example_training"]
    )
    assert 0.9 < ratio <= 1.0
    assert (
        torch_record["flops"]["analytical_per_example_forward"]
        == tf_record["flops"]["analytical_per_example_forward"]
    )


def test_the_runner_process_refuses_tensorflow(torch_installed, tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import runpy, sys\n"
        "sys.argv = ['hpcai500-tf', 'train', 'image_classification', '--framework', 'pytorch', "
        f"'--preset', 'tiny', '--out', {str(tmp_path)!r}]\n"
        "from hpcai500_tf.pytorch import train as torch_train\n"
        "torch_train.run = lambda *a, **k: __import__('tensorflow')\n"
        "from hpcai500_tf.cli import main\n"
        "main()\n"
    )
    result = subprocess.run(
        [sys.executable, str(probe)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "import of tensorflow halted" in result.stderr


SHARED_WITHOUT_TENSORFLOW = (
    "hpcai500_tf.run.progress",
    "hpcai500_tf.run.record",
    "hpcai500_tf.run.energy",
    "hpcai500_tf.run.status",
    "hpcai500_tf.run.mlperf_log",
    "hpcai500_tf.results.record_builder",
    "hpcai500_tf.record",
    "hpcai500_tf.validation",
    "hpcai500_tf.energy.integrate",
    "hpcai500_tf.energy.meter_log",
    "hpcai500_tf.energy.sampler",
    "hpcai500_tf.energy.sources",
    "hpcai500_tf.mlperf.mllog",
    "hpcai500_tf.cluster.devices",  # bf16 against the GPU generation
    "hpcai500_tf.cluster.machine",  # L1, L2
    "hpcai500_tf.benchmark_layers",  # L6-L9
    "hpcai500_tf.backends",  # the registry the CLI asks
    "hpcai500_tf.config",
    "hpcai500_tf.run.lifecycle",
    "hpcai500_tf.report.tensorboard",
    "hpcai500_tf.run.directory",
    "hpcai500_tf.cluster.workers",  # the CLI's strategy override, before any framework loads
)


def test_the_modules_the_runner_shares_never_import_tensorflow():
    """What the PyTorch runner imports of this package loads no TensorFlow, directly or
    through another module (with or without torch installed)."""
    probe = (
        "import importlib, sys\n"
        f"for name in {SHARED_WITHOUT_TENSORFLOW!r}:\n"
        "    importlib.import_module(name)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow')\n"
        "assert 'tensorflow' not in sys.modules, loaded\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_pytorch_runner_reads_the_imagenet_tfrecord_shards(
    torch_installed,
    tmp_path,
    imagenet_dir,  # noqa: F811
):
    overrides = [
        *IMAGENET_FIXTURE_SETTINGS,
        "training.batch_per_replica=4",
        "training.deterministic=true",  # imports torch._inductor (and triton where present)
    ]
    result = run_runner(
        "image_classification", "--preset", "tiny", "--data", str(imagenet_dir),
        "--out", str(tmp_path), "--power-hz", "0", *(f"--set={o}" for o in overrides),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (path,) = tmp_path.glob("*/record.json")
    rec = record.load(path)
    assert rec["source"]["framework"] == "pytorch"
    # L9 is verified from the data in the feeder's process and reaches the record: 12 records
    # are not ImageNet-1k, and the run is not rankable for it.
    assert rec["layers"]["L9"]["dataset"].startswith("imagenet-format TFRecords (12 train")
    assert rec["layers"]["L9"]["train_examples"] == 12 and not rec["rankable"]
    assert any(r.startswith("data: ") for r in rec["not_rankable_reasons"])


def test_bad_data_is_one_line_from_the_feeder(torch_installed, tmp_path):
    result = run_runner(
        "image_classification", "--preset", "tiny", "--data", str(tmp_path / "missing"),
        "--set=data.source=imagenet", "--out", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 2
    # The last line is the runner's own; that it is the only one, whatever TensorFlow prints
    # on this CPU, tests/test_entry_points.py checks in a clean environment.
    assert result.stderr.strip().splitlines()[-1].startswith("hpcai500-tf: error:")
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.glob("*/record.json"))


# ------------------------------------------------------------------------ the feeder


def test_feeder_streams_interleave_and_match_the_pipeline():
    """A training stream left mid-way, an evaluation stream read to its end, then the
    training stream again: each gets its own batches, in the pipeline's order."""
    import keras

    from hpcai500_tf import benchmark_layers, config
    from hpcai500_tf.workloads import build_workload

    setup = config.prepare("image_classification", "tiny", ["training.batch_per_replica=16"])
    workload = build_workload("image_classification", setup.config, None)
    keras.utils.set_random_seed(setup.training.seed)  # the feeder seeds as the engine does
    expected_eval = list(workload.dataset(False, 7, (1, 0)).batch(16).as_numpy_iterator())
    feeder = Feeder("image_classification", setup.config, None, 16, deterministic=True)
    try:
        assert feeder.workload.eval_examples == workload.eval_examples
        assert feeder.workload.layer == workload.workload_layer()
        # L7 names PyTorch's own layers, whatever TensorFlow's "auto" resolves to here.
        l7 = benchmark_layers.run_layers(
            setup, feeder.workload, workers=1, replicas=1, global_batch=16,
            precision="float32", intra_op_threads=1,
        )["L7"]  # fmt: skip
        assert l7["kernels"] == "stock"
        train = feeder.batches(True, 3)
        first = [next(train)[1].copy() for _ in range(2)]
        got = [(i.copy(), la.copy(), n) for i, la, n in feeder.batches(False, 7)]
        assert sum(n for *_, n in got) == workload.eval_examples
        for (images, labels, _), (want_images, want_labels) in zip(got, expected_eval, strict=True):
            np.testing.assert_array_equal(labels, want_labels)
            # The feeder hands PyTorch the model's input: the pipeline's uint8 normalised.
            np.testing.assert_allclose(images, workload.model_inputs(want_images).numpy())
        images, labels, count = next(train)  # the training stream goes on where it was
        assert count == 16 and images.shape == (16, 16, 16, 3) and labels.dtype == np.int64
        expected_train = list(
            workload.dataset(True, 3, (1, 0)).repeat().batch(16, drop_remainder=True).take(3)
        )
        np.testing.assert_array_equal(first[0], expected_train[0][1].numpy())
        np.testing.assert_array_equal(labels, expected_train[2][1].numpy())
    finally:
        feeder.close()
    assert not feeder._process.is_alive()


def test_feeder_reports_a_dead_data_process():
    from hpcai500_tf import config
    from hpcai500_tf.pytorch.feeder import FeederError

    setup = config.prepare("image_classification", "tiny", [])
    feeder = Feeder("image_classification", setup.config, None, 8, deterministic=True)
    try:
        feeder._process.kill()
        feeder._process.join(10)
        with pytest.raises(FeederError, match="ended unexpectedly"):
            next(feeder.batches(True, 1))
    finally:
        feeder.close()


def test_the_data_process_outlives_a_stop_signal():
    """Slurm signals every process of a step (scancel, the time limit's SIGUSR1 through
    srun): the data process must go on serving while the runner agrees on the stop and
    checkpoints, or the run fails where it should stop."""
    import os
    import signal

    from hpcai500_tf import config

    setup = config.prepare("image_classification", "tiny", [])
    feeder = Feeder("image_classification", setup.config, None, 8, deterministic=True)
    try:
        batches = feeder.batches(True, 1)
        next(batches)
        for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGHUP):
            os.kill(feeder._process.pid, signum)
        feeder._process.join(1)
        assert feeder._process.is_alive()
        assert next(batches)[2] == 8
    finally:
        feeder.close()
    assert not feeder._process.is_alive()


# ------------------------------------------------------------------------ which torch


def fake_torch(version="2.13.0", cuda=None, hip=None, available=False):
    return types.SimpleNamespace(
        __version__=version,
        version=types.SimpleNamespace(cuda=cuda, hip=hip),
        cuda=types.SimpleNamespace(is_available=lambda: available),
        device=lambda name: types.SimpleNamespace(type=name),
    )


def test_a_torch_too_old_is_refused_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", fake_torch("2.1.2+cpu"))
    with pytest.raises(
        UserError, match=r"torch 2.1.2\+cpu is too old .*pip install -U 'torch>=2.3'"
    ):
        torch_build.import_torch()
    assert torch_build.version_tuple("2.14.1+cu130") == (2, 14)


def test_gpus_this_torch_cannot_use_are_refused_not_skipped(monkeypatch):
    monkeypatch.setattr(torch_build, "nvidia_gpus_present", lambda: True)
    with pytest.raises(UserError, match="CPU-only build.*--device cpu"):
        torch_build.choose_device(fake_torch(), "auto")
    with pytest.raises(UserError, match="CUDA 12.1 needs a newer driver"):
        torch_build.choose_device(fake_torch(cuda="12.1"), "auto")
    assert torch_build.choose_device(fake_torch(), "cpu").type == "cpu"
    monkeypatch.setattr(torch_build, "nvidia_gpus_present", lambda: False)
    # A CUDA build on a machine without NVIDIA GPUs trains on the CPU (and says so in L5).
    assert torch_build.choose_device(fake_torch(cuda="13.0"), "auto").type == "cpu"
    with pytest.raises(UserError, match="--device cuda: this torch is a CPU-only build"):
        torch_build.choose_device(fake_torch(), "cuda")
    assert torch_build.choose_device(fake_torch(cuda="13.0", available=True), "auto").type == "cuda"


def test_bf16_on_a_gpu_without_bfloat16_is_refused(torch_installed):
    import torch

    def gpu(capability):
        return types.SimpleNamespace(
            float16=torch.float16,
            bfloat16=torch.bfloat16,
            cuda=types.SimpleNamespace(get_device_capability=lambda device: capability),
        )

    cuda = types.SimpleNamespace(type="cuda")
    with pytest.raises(UserError, match=r"bf16 on GPU compute capability 7\.0.*precision=fp16"):
        torch_build.check_mixed_precision(gpu((7, 0)), cuda, "mixed_bfloat16")
    # The CPU computes bfloat16 whatever its generation; fp16 is asked for on a V100 as published.
    torch_build.check_mixed_precision(torch, torch.device("cpu"), "mixed_bfloat16")


def test_the_build_is_named(torch_installed):
    import torch

    text = torch_build.torch_build(torch)
    assert text.startswith(f"torch {torch.__version__} (")
    assert ("CPU-only build" in text) == (torch.version.cuda is None and torch.version.hip is None)


# ------------------------------------------------------------------------ the demo script


def fake_venv(tmp_path: Path, tensorflow_side: str, pytorch_side: str) -> Path:
    """A virtual environment whose hpcai500-tf runs the given shell line for each side (the
    PyTorch one where it is given --framework pytorch)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    script = venv / "bin" / "hpcai500-tf"
    script.write_text(
        "#!/usr/bin/env bash\necho hpcai500-tf says hello\n"
        f'if [[ " $* " == *" --framework pytorch "* ]]; then {pytorch_side}; '
        f"else {tensorflow_side}; fi\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return venv


@pytest.mark.parametrize(
    "tensorflow_side, pytorch_side, side, code",
    [
        ("exit 3", "exit 0", "tensorflow", 3),
        ("exit 0", "kill -SEGV $$", "pytorch", 139),
    ],
)
def test_the_demo_names_the_side_that_failed(tmp_path, tensorflow_side, pytorch_side, side, code):
    venv = fake_venv(tmp_path, tensorflow_side, pytorch_side)
    out = tmp_path / "out"
    result = run_demo(out, venv, timeout=60)
    assert result.returncode == code
    assert f"the {side} side failed with exit code {code}" in result.stderr
    assert f"its log: {out}/{side}.log" in result.stderr
    assert "says hello" in (out / f"{side}.log").read_text()
    if code == 139:
        assert "signal 11: SEGV" in result.stderr
    assert not (out / "comparison.json").exists()


@pytest.mark.parametrize(
    "settings, named",
    [
        (["optimizer.momentum_form=keras"], "TF1's momentum form only"),
        (["model.stride_padding=same"], "pads strided convolutions symmetrically only"),
        (["optimizer.loss_scaling=fixed", "training.precision=fp16"], "dynamically only"),
        (["training.xla=true"], "does not compile with XLA"),
    ],
)
def test_forms_the_runner_does_not_train_are_refused_in_one_line(settings, named):
    from hpcai500_tf import config
    from hpcai500_tf.pytorch import train as torch_train

    torch_train.refuse_other_forms(config.prepare("image_classification", "reference", []), True)
    with pytest.raises(UserError, match=named):
        setup = config.prepare("image_classification", "tiny", settings)
        torch_train.refuse_other_forms(setup, on_cuda=True)


def test_the_logits_start_as_the_tensorflow_models_do(torch_installed):
    import torch

    from hpcai500_tf.pytorch import train as torch_train

    fc = torch.nn.Linear(2048, 1001)
    torch_train.initialise_logits(torch, fc, "variance_scaling")
    weight = fc.weight.detach().double()
    sigma = (2.0 / 1001) ** 0.5 / 0.87962566103423978
    assert float(weight.abs().max()) <= 2 * sigma * (1 + 1e-6)
    assert float(weight.std()) == pytest.approx((2.0 / 1001) ** 0.5, rel=0.01)
    torch_train.initialise_logits(torch, fc, "normal_0.01")
    assert float(fc.weight.detach().std()) == pytest.approx(0.01, rel=0.01)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--framework", "jax"], "invalid choice: 'jax'"),
        (["--device", "cuda"], "--device is for --framework pytorch"),
        (["--framework", "pytorch", "--resume", "x"], "x: not a run directory (no config.json)"),
    ],
)
def test_a_framework_or_option_it_lacks_is_one_line(arguments, message, capsys):
    from hpcai500_tf.cli import main

    with pytest.raises(SystemExit) if "jax" in arguments else contextlib.nullcontext():
        code = main(["train", "image_classification", *arguments])
        assert code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_the_same_corrupt_shard_mid_run_is_a_failed_run_on_both_frameworks(
    torch_installed,
    tmp_path,
    imagenet_dir,  # noqa: F811
):
    from .test_hardening import _corrupt_a_payload

    data = tmp_path / "data"
    data.mkdir()
    for shard in imagenet_dir.iterdir():
        (data / shard.name).write_bytes(shard.read_bytes())
    _corrupt_a_payload(data / "train-00001-of-00002")
    settings = [*IMAGENET_FIXTURE_SETTINGS, "training.batch_per_replica=4"]
    statuses, warnings = {}, {}
    for framework in ("tensorflow", "pytorch"):
        out = tmp_path / framework
        args = ["train", "image_classification", "--framework", framework, "--preset", "tiny",
                "--data", str(data), "--out", str(out), "--power-hz", "0",
                *(f"--set={s}" for s in settings)]  # fmt: skip
        if framework == "tensorflow":  # in this process: TensorFlow is loaded here already
            from hpcai500_tf.cli import main

            assert main(args) == 1
        else:  # its own process: the PyTorch backend blocks TensorFlow in the process it loads in
            result = subprocess.run([sys.executable, "-m", "hpcai500_tf.cli", *args],
                                    capture_output=True, text=True, timeout=300)  # fmt: skip
            assert result.returncode == 1, result.stderr[-2000:]
        (path,) = out.glob("*/record.json")
        rec = record.load(path)
        statuses[framework], warnings[framework] = rec["status"], rec["warnings"][0]
    assert statuses == {"tensorflow": "failed", "pytorch": "failed"}
    # A shard whose record check fails: TensorFlow's DataLossError, in the same words on both.
    assert all(
        w.startswith("the run failed: ") and "DataLossError" in w for w in warnings.values()
    ), warnings
    # The PyTorch side names the user's shard file, not TensorFlow's op text.
    assert str(data / "train-00001-of-00002") in warnings["pytorch"], warnings
    assert "{{" not in warnings["pytorch"] and "[Op:" not in warnings["pytorch"], warnings


def test_a_nan_loss_is_a_diverged_run_on_both_frameworks(torch_installed, tmp_path):
    """The PyTorch side's loss made NaN in its own process; the TensorFlow side's is checked in
    tests/test_train.py (test_diverged_loss_ends_the_run_non_zero): the same status and words."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sys\n"
        "from hpcai500_tf.pytorch import train as torch_train\n"
        "torch_train.TorchTrainer.loss_value = lambda self, loss: float('nan')\n"
        "from hpcai500_tf.cli import main\n"
        "if __name__ == '__main__':  # the feeder process is spawned: it imports this file\n"
        "    sys.exit(main(['train', 'image_classification', '--framework', 'pytorch', "
        f"'--preset', 'tiny', '--power-hz', '0', '--out', {str(tmp_path / 'out')!r}]))\n"
    )
    result = subprocess.run(
        [sys.executable, str(probe)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1, result.stderr[-2000:]
    (path,) = (tmp_path / "out").glob("*/record.json")
    rec = record.load(path)
    assert rec["status"] == "diverged"
    assert rec["warnings"][0].startswith("loss became nan in epoch 1, step "), rec["warnings"]


def test_float16_loss_scaling_starts_where_the_tensorflow_side_does():
    """L8's initial_loss_scale is one value for both frameworks (it was 2**16 on PyTorch,
    GradScaler's default, against Keras's 2**15)."""
    import keras

    from hpcai500_tf.pytorch import train as torch_train

    keras_start = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()).initial_scale
    assert torch_train.INITIAL_LOSS_SCALE == keras_start == 2.0**15
