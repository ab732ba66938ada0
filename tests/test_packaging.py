"""A wheel built from the tree installs every package and the configs a clone reads."""

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _declared_packages() -> set[str]:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    return set(setup["options"]["packages"].split())


def test_setup_cfg_lists_every_package_of_the_tree():
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "hpcai500_tf").rglob("__init__.py")
    }
    assert on_disk | {"hpcai500_tf.configs"} == _declared_packages()


def test_an_installed_wheel_finds_its_configs(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is needed to list the tracked files")
    source = tmp_path / "source"
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, (t.decode() for t in tracked)):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, source], check=True
    )
    (wheel,) = wheels.glob("hpcai500_tf-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", site, wheel], check=True)
    probe = (
        "from hpcai500_tf import config\n"
        "print(config.CONFIG_DIR)\n"
        "print(','.join(config.benchmark_names()))\n"
        "print(config.load_benchmark('image_classification').presets['smoke']['inherits'])\n"
        "print(','.join(config.load_levels()[0]))\n"
    )
    shown = subprocess.run(
        [sys.executable, "-s", "-c", probe],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    where, names, inherits, levels = shown.stdout.split()
    assert Path(where) == site / "hpcai500_tf" / "configs"
    assert names == "extreme_weather,image_classification"
    assert inherits == "reference"
    assert levels == "free,system,hardware"


def test_the_test_command_never_installs_the_cpu_extra_over_the_gpu_tensorflow(tmp_path):
    """A GPU user's .venv (the cuda extra's tensorflow) is refused before pip runs: the cpu
    extra installed over it would leave tensorflow-cpu beside tensorflow."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    fake = tmp_path / ".venv" / "bin"
    fake.mkdir(parents=True)
    (fake / "python").write_text('#!/bin/sh\ncase "$2" in *"tensorflow-cpu"*) exit 1;; esac\n')
    (fake / "pip").write_text(f'#!/bin/sh\ntouch "{tmp_path}/pip-ran"\n')
    for name in ("python", "pip"):
        (fake / name).chmod(0o755)
    result = subprocess.run(
        ["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(".ci/run: error: .venv holds the GPU TensorFlow")
    assert not (tmp_path / "pip-ran").exists()
