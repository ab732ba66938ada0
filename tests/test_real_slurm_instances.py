"""`train --instances 2` under a real two-node Slurm (the cluster of test_real_slurm.py):
one instance per node, each a single worker (no collective across them), and one completed
throughput record written by the chief that ended last."""

import json

import pytest

from hpcai500_tf.run import throughput
from tests.test_real_slurm import CLI, real_slurm  # noqa: F401 (the fixture)


@pytest.mark.slow
def test_srun_n2_instances_2_gives_one_single_worker_instance_per_node(real_slurm):  # noqa: F811
    out, logs = real_slurm.root / "instances", real_slurm.root / "out"
    run = real_slurm.srun(
        "-N2", "-n2", f"--output={logs}/instances-%j-%t.log",
        CLI, "train", "image_classification", "--preset", "tiny", "--instances", "2",
        "--set", "training.epochs=1", "--out", str(out), "--power-hz", "0", "--no-tensorboard",
    )  # fmt: skip
    tasks = sorted(logs.glob("instances-*-*.log"))
    output = "".join(f"\n--- {path.name}\n{path.read_text()[-3000:]}" for path in tasks)
    assert run.returncode == 0, f"srun: {run.returncode}{run.stderr}{output}{real_slurm.logs()}"
    (path,) = out.glob("*-x2-*/throughput.json")
    data = throughput.load(path)
    assert data["status"] == "completed" and data["placement"] == "slurm"
    assert [m["exit_code"] for m in data["members"]] == [0, 0]
    assert [m["hosts"] for m in data["members"]] == [["node9"], ["node10"]]  # one per node
    for member in data["members"]:
        rec = json.loads((path.parent / member["run_dir"] / "record.json").read_text())
        assert rec["status"] == "completed"
        assert rec["layers"]["L6"]["workers"] == 1  # its own, never a collective across both
    said = [path.read_text() for path in tasks]
    assert "instance 0 of 2 on node9" in said[0] and "instance 1 of 2 on node10" in said[1]
    assert throughput.score(path).instances == 2
