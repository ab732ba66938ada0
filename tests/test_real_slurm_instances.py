"""`train --instances 2` under a real two-node Slurm (the cluster of test_real_slurm.py):
one instance per node, each a single worker (no collective across them), one completed
throughput record written by the chief that ended last, with the machine's energy over the
window (a simulated RAPL counter read on each node, each node sampled over the whole
window); and a scancel mid-run that still leaves one throughput record, naming the stopped
instances."""

import json
import subprocess
import time

import pytest

from hpcai500_tf import record
from hpcai500_tf.errors import UserError
from hpcai500_tf.run import throughput, window_energy
from tests.test_energy import RaplWriter, _zone
from tests.test_real_slurm import CLI, _wait_for, real_slurm  # noqa: F401 (the fixture)

WATTS = 60.0  # the simulated package's power, read on each node
# One test process runs this module's tests beside the other real-Slurm module's (CI's
# `--dist loadgroup`): one cluster at a time.
pytestmark = pytest.mark.xdist_group("real_slurm")


@pytest.mark.slow
def test_srun_n2_instances_2_gives_one_single_worker_instance_per_node(real_slurm):  # noqa: F811
    """About 50 s on 2 cores."""
    out, logs = real_slurm.root / "instances", real_slurm.root / "out"
    powercap = real_slurm.root / "powercap"
    _zone(powercap, "intel-rapl:0", "package-0", 0, max_uj=1_000_000_000)  # wraps at 1000 J
    with RaplWriter(powercap, watts=WATTS):
        run = real_slurm.srun(
            "-N2", "-n2", f"--output={logs}/instances-%j-%t.log",
            f"--export=ALL,HPCAI500_POWERCAP_ROOT={powercap}",
            CLI, "train", "image_classification", "--preset", "tiny", "--instances", "2",
            "--set", "training.epochs=1", "--out", str(out), "--power-hz", "20",
            "--no-tensorboard",
        )  # fmt: skip
    tasks = sorted(logs.glob("instances-*-*.log"))
    output = "".join(f"\n--- {path.name}\n{path.read_text()[-3000:]}" for path in tasks)
    assert run.returncode == 0, f"srun: {run.returncode}{run.stderr}{output}{real_slurm.logs()}"
    (path,) = out.glob("*-x2-*/throughput.json")
    data = throughput.load(path)
    assert data["status"] == "completed" and data["placement"] == "slurm"
    assert [m["exit_code"] for m in data["members"]] == [0, 0]
    assert [m["hosts"] for m in data["members"]] == [["node9"], ["node10"]]  # one per node
    records = []
    for member in data["members"]:
        rec = json.loads((path.parent / member["run_dir"] / "record.json").read_text())
        assert rec["status"] == "completed"
        assert rec["layers"]["L6"]["workers"] == 1  # its own, never a collective across both
        assert rec["energy"]["measured"], rec["energy"]
        records.append(rec)
    said = [path.read_text() for path in tasks]
    assert "instance 0 of 2 on node9" in said[0] and "instance 1 of 2 on node10" in said[1]
    assert throughput.score(path).instances == 2
    # the window's energy: each node sampled over the whole window by its first task, its
    # package once (both nodes read this one file here), not only over its instance's run
    energy = data["energy"]
    assert energy["measured"], energy
    window_s = data["window"]["stop"] - data["window"]["start"]
    assert energy["joules"] == pytest.approx(2 * WATTS * window_s, rel=0.15)
    assert energy["joules"] >= 0.98 * sum(r["energy"]["joules"] for r in records)
    assert energy["average_watts"] == pytest.approx(2 * WATTS, rel=0.15)
    assert energy["coverage"] > 0.95 and not [n for n in energy["notes"] if "of the" in n]
    assert "node node9" in energy["scope"] and "node node10" in energy["scope"]
    assert energy["method"] == window_energy.NODE_METHOD
    assert throughput.score(path).average_watts == pytest.approx(energy["average_watts"])


@pytest.mark.slow
def test_scancel_of_an_instances_step_leaves_a_stopped_throughput_record(real_slurm):  # noqa: F811
    """scancel (SIGTERM to every task of the step) once both instances train: each writes its
    stopped record, each task lives to leave its member note, and the last one the throughput
    record, status stopped, naming both instances. About 45 s on 2 cores."""
    out, logs = real_slurm.root / "stopped", real_slurm.root / "out"
    srun = subprocess.Popen(
        ["timeout", "-k", "10", "300", *real_slurm.enter("node9"), "srun", "-N2", "-n2",
         "-J", "h2-instances-stop", f"--output={logs}/stop-%j-%t.log",
         CLI, "train", "image_classification", "--preset", "tiny", "--instances", "2",
         "--set", "training.epochs=200", "--out", str(out), "--power-hz", "0",
         "--no-tensorboard"],
        env=real_slurm.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip

    def both_train() -> bool:
        logs_seen = list(out.glob("*-x2-*/instance-*/*/mlperf.log"))
        return len(logs_seen) == 2 and all('"epoch_start"' in p.read_text() for p in logs_seen)

    try:
        _wait_for("both instances' first epoch", both_train, 180, real_slurm.logs)
        time.sleep(0.5)
        real_slurm.on("node9", "scancel", "-n", "h2-instances-stop")
        output, _ = srun.communicate(timeout=90)
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()
    tasks = "".join(p.read_text()[-2000:] for p in sorted(logs.glob("stop-*-*.log")))
    (path,) = out.glob("*-x2-*/throughput.json")
    data = throughput.load(path)
    assert data["status"] == "stopped", f"{output}{tasks}"
    assert [m["stopped_by"] for m in data["members"]] == ["SIGTERM", "SIGTERM"], data["members"]
    assert all(m["ended"].startswith("stopped by SIGTERM: ") for m in data["members"])
    assert "stopped by SIGTERM: instance(s) 0, 1 of 2" in data["warnings"]
    for member in data["members"]:
        rec = record.load(path.parent / member["run_dir"] / "record.json")
        assert rec["status"] == "stopped"  # each kept its work, resumable on its own
    with pytest.raises(UserError, match="were stopped"):
        throughput.score(path)
