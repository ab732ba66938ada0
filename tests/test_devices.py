"""The devices a run computes on: no silent CPU fallback where the machine has GPUs, the
first-use compile of kernels announced, NVIDIA's GPU settings set and recorded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hpcai500_tf import tensorflow_import
from hpcai500_tf.cli import build_parser, main
from hpcai500_tf.cluster import devices as cluster_devices
from hpcai500_tf.cluster import machine
from hpcai500_tf.engine import devices
from hpcai500_tf.engine.library_layers import library_layers
from hpcai500_tf.errors import UserError
from hpcai500_tf.run.launch import worker_args

# TensorFlow 2.21's CUDA wheels: SASS up to Ada (8.9), PTX for Hopper (9.0).
TF_221_ARCHITECTURES = ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"]
CPU_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"


def _fake_gpus(count: int):
    """NVML's answer for a machine with `count` GPUs."""
    gpus = [
        {"index": i, "model": "NVIDIA H100", "memory_bytes": 80 << 30, "uuid": f"GPU-{i}abc"}
        for i in range(count)
    ]
    return lambda: (gpus, "570.00" if count else None, None if count else "no GPU")


@pytest.fixture
def two_gpus(monkeypatch):
    """A machine whose NVML sees two GPUs, all visible: this CPU-only TensorFlow sees none."""
    monkeypatch.setattr(machine, "nvidia_gpus", _fake_gpus(2))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


# The check as a pure function.


def test_gpus_tensorflow_does_not_see_are_refused_in_one_line_naming_the_fix():
    with pytest.raises(UserError) as refused:
        devices.gpu_check(visible=2, tensorflow_gpus=0, allow_cpu=False)
    message = str(refused.value)
    assert "\n" not in message
    assert "2 GPUs" in message and "TensorFlow sees none" in message
    for fix in ("list_physical_devices('GPU')", "tensorflow[and-cuda]", "nvidia-smi"):
        assert fix in message
    assert "--allow-cpu" in message


def test_fewer_gpus_than_visible_are_refused_too():
    with pytest.raises(UserError, match="TensorFlow sees 1 of the 2 GPUs"):
        devices.gpu_check(visible=2, tensorflow_gpus=1, allow_cpu=False)


def test_allow_cpu_turns_the_refusal_into_a_warning():
    warning = devices.gpu_check(visible=2, tensorflow_gpus=0, allow_cpu=True)
    assert "TensorFlow sees none" in warning and "--allow-cpu" in warning


@pytest.mark.parametrize("visible, seen", [(0, 0), (2, 2), (1, 1), (0, 1)])
def test_every_visible_gpu_seen_or_none_there_passes_silently(visible, seen):
    assert devices.gpu_check(visible, seen, allow_cpu=False) is None


def test_cuda_visible_devices_narrows_the_gpus_expected(monkeypatch):
    monkeypatch.setattr(machine, "nvidia_gpus", _fake_gpus(4))
    assert machine.visible_gpu_count({}) == 4
    assert machine.visible_gpu_count({"CUDA_VISIBLE_DEVICES": "1,3"}) == 2
    assert machine.visible_gpu_count({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert machine.visible_gpu_count({"CUDA_VISIBLE_DEVICES": "GPU-2"}) == 1
    assert machine.visible_gpu_count({"CUDA_VISIBLE_DEVICES": "MIG-abc"}) == 1
    monkeypatch.setattr(machine, "nvidia_gpus", _fake_gpus(0))
    assert machine.visible_gpu_count({"CUDA_VISIBLE_DEVICES": "0"}) == 0


# A worker's share (HPCAI500_WORKER_GPUS, `--workers N`): positions in the list CUDA sees.


def _mixed_node(monkeypatch):
    """NVML's answer for a node of two A100s (NVML 0, 1) and two H100s (2, 3)."""
    models = ["NVIDIA A100-SXM4-80GB"] * 2 + ["NVIDIA H100 80GB HBM3"] * 2
    gpus = [
        {"index": i, "model": model, "memory_bytes": 80 << 30, "uuid": f"GPU-{i}abc"}
        for i, model in enumerate(models)
    ]
    monkeypatch.setattr(machine, "nvidia_gpus", lambda: (gpus, "570.00", None))
    return gpus


def test_a_share_picks_its_gpus_through_cuda_visible_devices_order(monkeypatch):
    uuids = [gpu["uuid"] for gpu in _mixed_node(monkeypatch)]
    share = cluster_devices.WORKER_GPUS
    assert cluster_devices.computing_gpus({share: "2,3"}, uuids) == ([2, 3], None)
    # positions in CUDA's list: CUDA_VISIBLE_DEVICES=3,1,0,2 makes position 0 NVML's GPU 3
    listed = {"CUDA_VISIBLE_DEVICES": "3,1,0,2", share: "0,1"}
    assert cluster_devices.computing_gpus(listed, uuids) == ([3, 1], None)
    # a share that does not fit is noted, not applied (the strategy refuses it before a run)
    assert cluster_devices.computing_gpus({share: "4"}, uuids) == (
        [0, 1, 2, 3],
        "HPCAI500_WORKER_GPUS='4' names a GPU beyond the 4 CUDA makes visible here "
        "(positions from 0)",
    )
    assert machine.visible_gpu_count({share: "2,3"}) == 2
    assert machine.visible_gpu_count({"CUDA_VISIBLE_DEVICES": "1,3", share: "1"}) == 1


def test_the_gpus_expected_of_tensorflow_are_the_share(monkeypatch):
    _mixed_node(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv(cluster_devices.WORKER_GPUS, "2,3")
    with pytest.raises(UserError, match="this machine has 2 GPUs this process may use"):
        devices.check_devices(_default_strategy(), allow_cpu=False)


def test_l1_and_the_peak_follow_the_share(monkeypatch):
    from hpcai500_tf.roofline import peaks

    _mixed_node(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv(cluster_devices.WORKER_GPUS, "2,3")
    layer = machine.hardware_layer(workers=2)
    assert [g["visible"] for g in layer["accelerators"]] == [False, False, True, True]
    assert layer["summary"] == "2 workers x 2 x NVIDIA H100 80GB HBM3 (of 4)"
    assert peaks.theoretical_peak("fp32", layer)[1].startswith("NVIDIA H100 80GB HBM3 = ")


class FourBoards:
    """The part of pynvml the energy sources use: four GPUs with energy counters."""

    class NVMLError(Exception):
        pass

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 4

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{handle}abc"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return 1000 * handle


def test_energy_counts_the_boards_of_the_share(monkeypatch):
    from hpcai500_tf.energy.sources import nvml_sources

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setenv(cluster_devices.WORKER_GPUS, "1,2")
    sources, note = nvml_sources(FourBoards())
    assert [(s.name, s.uuid) for s in sources] == [("gpu1", "GPU-1abc"), ("gpu2", "GPU-2abc")]
    assert note == (
        "gpu0 (NVIDIA H100 80GB HBM3), gpu3 (NVIDIA H100 80GB HBM3) left out: not among the "
        "GPUs this worker computes on (CUDA_VISIBLE_DEVICES='0,1,2,3', "
        "HPCAI500_WORKER_GPUS='1,2')"
    )


def test_device_kind_reads_tensorflow_device_names():
    assert devices.device_kind("/job:worker/replica:0/task:1/device:GPU:3") == "GPU"
    assert devices.device_kind(CPU_DEVICE) == "CPU"


# The check on this machine's TensorFlow (CPU only), NVML faked.


def _devices_in_l5(strategy=None) -> list[str]:
    return devices.devices_used(strategy or _default_strategy(), 0)


def _default_strategy():
    import tensorflow as tf

    return tf.distribute.get_strategy()


def test_a_machine_with_gpus_tensorflow_cannot_use_is_refused(two_gpus):
    with pytest.raises(UserError, match="TensorFlow sees none"):
        devices.check_devices(_default_strategy(), allow_cpu=False)


def test_allow_cpu_proceeds_with_a_warning(two_gpus, capsys):
    warnings = devices.check_devices(_default_strategy(), allow_cpu=True)
    assert len(warnings) == 1 and "--allow-cpu" in warnings[0]
    assert "TensorFlow sees none" in capsys.readouterr().err
    assert _devices_in_l5() == [CPU_DEVICE]


def test_a_machine_without_gpus_proceeds_silently(monkeypatch, capsys):
    monkeypatch.setattr(machine, "nvidia_gpus", _fake_gpus(0))
    assert devices.check_devices(_default_strategy(), allow_cpu=False) == []
    assert capsys.readouterr().err == ""
    assert _devices_in_l5() == [CPU_DEVICE]


def test_the_mirrored_strategy_devices_are_recorded(monkeypatch):
    import tensorflow as tf

    monkeypatch.setattr(machine, "nvidia_gpus", _fake_gpus(0))
    strategy = tf.distribute.MirroredStrategy()
    devices.check_devices(strategy, allow_cpu=False)
    assert _devices_in_l5(strategy) == [CPU_DEVICE]


def test_sysinfo_without_a_run_names_no_devices_used():
    assert "devices_used" not in library_layers()[1]


def test_a_runs_record_names_the_devices_it_computed_on(tf_tiny):
    _, rec = tf_tiny
    assert rec["layers"]["L5"]["devices_used"] == [CPU_DEVICE]


def test_flops_is_refused_on_a_machine_with_unseen_gpus_unless_allowed(two_gpus, capsys):
    assert main(["flops", "image_classification", "--preset", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("hpcai500-tf: error: this machine has 2 GPUs")


def test_allow_cpu_is_a_flag_of_train_and_flops_and_reaches_the_workers():
    parser = build_parser()
    assert parser.parse_args(["flops", "--allow-cpu"]).allow_cpu
    train = parser.parse_args(["train", "image_classification", "--allow-cpu"])
    assert train.allow_cpu and "--allow-cpu" in worker_args(train)
    plain = parser.parse_args(["train", "image_classification"])
    assert not plain.allow_cpu and "--allow-cpu" not in worker_args(plain)


# The first-use compile of kernels from PTX.


def test_hopper_on_tensorflow_221_announces_the_compile_and_the_cache():
    line = devices.compile_notice([(9, 0)], TF_221_ARCHITECTURES, {"HOME": "/home/me"})
    assert "\n" not in line
    assert "9.0" in line and "PTX" in line and "first use" in line
    assert "/home/me/.nv/ComputeCache" in line and "CUDA_CACHE_MAXSIZE=4294967296" in line


def test_the_cache_named_is_the_users_own():
    environ = {"HOME": "/home/me", "CUDA_CACHE_PATH": "/scratch/cuda", "CUDA_CACHE_MAXSIZE": "1"}
    line = devices.compile_notice([(9, 0), (9, 0)], TF_221_ARCHITECTURES, environ)
    assert "/scratch/cuda" in line and ".nv" not in line and "CUDA_CACHE_MAXSIZE=1" in line
    off = devices.compile_notice([(9, 0)], TF_221_ARCHITECTURES, {"CUDA_CACHE_DISABLE": "1"})
    assert "compiles them again" in off


@pytest.mark.parametrize(
    "capability, compiled",
    [
        ((8, 9), TF_221_ARCHITECTURES),  # SASS for Ada
        ((8, 6), TF_221_ARCHITECTURES),  # sm_80's SASS runs on 8.6
        ((7, 5), TF_221_ARCHITECTURES),  # sm_70's on 7.5
        ((9, 0), ["sm_80", "sm_90a"]),  # arch-specific SASS on its own GPU; no PTX anyway
        ((10, 0), ["sm_80", "sm_90a"]),  # no kernel at all: TensorFlow's own error, not ours
    ],
)
def test_no_notice_where_kernels_are_compiled_or_absent(capability, compiled):
    assert devices.compile_notice([capability], compiled, {"HOME": "/h"}) is None


def test_newer_gpus_than_the_ptx_are_announced_too():
    assert "10.0, 12.0" in devices.compile_notice(
        [(12, 0), (10, 0)], TF_221_ARCHITECTURES, {"HOME": "/h"}
    )


def test_a_cpu_build_lists_no_architectures_so_announces_nothing():
    assert devices.compile_notice([], [], {"HOME": "/h"}) is None
    assert devices.compile_notice([(9, 0)], [], {"HOME": "/h"}) is None


# NVIDIA's GPU settings.


def test_gpu_defaults_fill_only_what_the_user_left_unset():
    environ = {"TF_GPU_THREAD_MODE": "global"}
    assert tensorflow_import.apply_gpu_defaults(environ) == [
        "TF_USE_CUDNN_BATCHNORM_SPATIAL_PERSISTENT"
    ]
    assert environ == {
        "TF_GPU_THREAD_MODE": "global",
        "TF_USE_CUDNN_BATCHNORM_SPATIAL_PERSISTENT": "1",
    }
    rows = tensorflow_import.gpu_environment(environ, {"TF_USE_CUDNN_BATCHNORM_SPATIAL_PERSISTENT"})
    assert rows == [
        "TF_USE_CUDNN_BATCHNORM_SPATIAL_PERSISTENT=1 (project default)",
        "TF_GPU_THREAD_MODE=global (user)",
    ]
    assert tensorflow_import.gpu_environment({}, set()) == [
        "TF_USE_CUDNN_BATCHNORM_SPATIAL_PERSISTENT unset",
        "TF_GPU_THREAD_MODE unset",
    ]


def test_l5_records_the_gpu_settings_and_who_set_them(monkeypatch):
    monkeypatch.setenv("TF_GPU_THREAD_MODE", "gpu_shared")
    monkeypatch.setenv("TF_USE_CUDNN_BATCHNORM_SPATIAL_PERSISTENT", "")  # restored after
    monkeypatch.delenv("TF_USE_CUDNN_BATCHNORM_SPATIAL_PERSISTENT")
    monkeypatch.setattr(tensorflow_import, "_set_by_project", set())
    tensorflow_import.apply_gpu_defaults()
    _, l5 = library_layers()
    assert l5["gpu_environment"] == [
        "TF_USE_CUDNN_BATCHNORM_SPATIAL_PERSISTENT=1 (project default)",
        "TF_GPU_THREAD_MODE=gpu_shared (user)",
    ]


def test_import_tensorflow_sets_the_defaults_before_tensorflow_starts():
    """In a fresh process, as the CLI does it: the user's value kept, the other one set, and
    glibc keeping freed memory."""
    show = (
        "import os; from hpcai500_tf.tensorflow_import import import_tensorflow, gpu_environment;"
        "from hpcai500_tf import freed_memory;"
        "import_tensorflow(); print(gpu_environment(), freed_memory.state())"
    )
    env = {**os.environ, "TF_GPU_THREAD_MODE": "gpu_shared", "TF_CPP_MIN_LOG_LEVEL": "2"}
    for name in ("TF_USE_CUDNN_BATCHNORM_SPATIAL_PERSISTENT", "MALLOC_MMAP_MAX_",
                 "MALLOC_TRIM_THRESHOLD_", "HPCAI500_KEEP_FREED_MEMORY",
                 "HPCAI500_FREED_MEMORY_SET"):  # fmt: skip
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-c", show], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "TF_USE_CUDNN_BATCHNORM_SPATIAL_PERSISTENT=1 (project default)" in result.stdout
    assert "TF_GPU_THREAD_MODE=gpu_shared (user)" in result.stdout
    assert "kept (project default: MALLOC_MMAP_MAX_=0" in result.stdout  # glibc, freed_memory.py


def test_a_run_records_the_devices_it_used(tf_tiny):
    _, rec = tf_tiny
    assert rec["layers"]["L5"]["devices_used"] == [CPU_DEVICE]
    assert len(rec["layers"]["L5"]["gpu_environment"]) == 2
    assert rec["layers"]["L5"]["freed_memory"].startswith(("kept", "the user's", "off", "not set"))
    assert not any("--allow-cpu" in warning for warning in rec["warnings"])


# bfloat16 asked for by name on GPUs that have none.


def test_bf16_is_refused_on_gpus_before_ampere_and_names_fp16():
    with pytest.raises(UserError, match=r"bf16 on GPU compute capability 7\.0, 7\.5: .*fp16"):
        cluster_devices.bfloat16_check("mixed_bfloat16", [(7, 0), (7, 5), (8, 0)])


@pytest.mark.parametrize(
    "policy, capabilities",
    [
        ("mixed_bfloat16", [(8, 0), (9, 0), (10, 0)]),  # A100, H100/H200, B200
        ("mixed_float16", [(7, 0)]),  # V100 in fp16, as the reference ran
        ("float32", [(6, 0)]),
    ],
)
def test_bf16_check_passes_what_the_hardware_computes(policy, capabilities):
    assert cluster_devices.bfloat16_check(policy, capabilities) is None
