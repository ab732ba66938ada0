"""A real Slurm: Debian's slurmctld, two slurmd and munged, started here, and hpcai500-tf run
under its srun. Every other Slurm test fakes Slurm's variables; here Slurm itself writes them.

The two nodes, node9 and node10, sort differently as text and as numbers. Each is a network
and host-name namespace of this machine (its own hostname, its own address on a private veth
link, 10.90.0.9 and 10.90.0.10), both inside one private mount namespace whose /etc/hosts
names them: nothing outside the namespaces is contacted or changed. One network namespace per
node is needed, not merely a loopback address per node: the project gives local task i the
same port on every node, as on a real cluster, and TensorFlow's server binds that port on
every address (0.0.0.0), so two "nodes" sharing one network would collide.

Each node has two fake GPUs (generic resources in gres.conf: files with /dev/null bound over
them, since Slurm wants character devices), so that srun's GPU binding is real too.

Config, state, logs, munge key and socket live under the test's temporary directory; every
daemon is started in the foreground and stopped by its own pid at the end, and any process
still inside the test's namespaces then (a slurmstepd, a task) is killed by its pid. Skipped
only where slurmd, slurmctld or munged is not installed, or the test does not run as root
(`.ci/run` installs them where apt-get runs as root)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CLI = str(Path(sys.executable).with_name("hpcai500-tf"))  # the venv's, run by every task
ADDRESSES = {"node9": "10.90.0.9", "node10": "10.90.0.10"}
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
SRUN_LIMIT_S = 300
FAKE_GPUS = 2  # per node, through Slurm's generic resources
# One test process runs this module's tests beside the other real-Slurm module's (CI's
# `--dist loadgroup`): one cluster at a time.
pytestmark = pytest.mark.xdist_group("real_slurm")


def _tool(name: str) -> str:
    path = shutil.which(name, path=SEARCH_PATH)
    assert path, f"{name} is not installed: the real-Slurm test needs it"
    return path


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _wait_for(what: str, ready, limit_s: float, why=lambda: "") -> None:
    deadline = time.monotonic() + limit_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {limit_s} s{why()}")
        time.sleep(0.2)


def _free_ports(count: int, enter: list[str]) -> list[int]:
    """`count` ports free inside the namespace `enter` leads into, picked by the kernel."""
    code = (
        "import socket\n"
        f"s = [socket.socket() for _ in range({count})]\n"
        "[x.bind(('0.0.0.0', 0)) for x in s]\n"
        "print(' '.join(str(x.getsockname()[1]) for x in s))\n"
    )
    out = subprocess.run([*enter, sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [int(port) for port in out.stdout.split()]


class RealSlurm:
    """munged, slurmctld and slurmd for node9 and node10, each in its own namespaces."""

    def __init__(self, root: Path):
        self.root = root
        for sub in ("etc", "munge", "state", "spool", "run", "log", "out", "dev"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self.conf = root / "etc" / "slurm.conf"
        self.socket = root / "munge" / "munge.socket"
        assert len(str(self.socket)) < 100, f"{self.socket}: too long for a unix socket"
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("SLURM") and k not in ("TF_CONFIG", "HPCAI500_SLURM_PORT_BASE")
        }
        # CPU only: both nodes are this machine, and would otherwise each take all its GPUs
        self.env |= {
            "SLURM_CONF": str(self.conf),
            "PATH": SEARCH_PATH,
            "CUDA_VISIBLE_DEVICES": "-1",
        }
        self.holders: dict[str, subprocess.Popen] = {}  # node -> sleep holding its namespaces
        self.daemons: list[tuple[str, subprocess.Popen]] = []
        self.namespaces: set[str] = set()

    # ---------------------------------------------------------------- namespaces
    def enter(self, node: str) -> list[str]:
        """The command prefix that runs a program on `node` (its mount, network and UTS)."""
        return ["nsenter", "-t", str(self.holders[node].pid), "-m", "-n", "-u", "--"]

    def on(self, node: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [*self.enter(node), *argv], capture_output=True, text=True, env=self.env,
            timeout=timeout,
        )  # fmt: skip
        assert out.returncode == 0, f"{' '.join(argv)} on {node}: {out.stderr}"
        return out

    def _hold(self, node: str, argv: list[str], outer: str) -> None:
        """A `sleep` holding `node`'s new namespaces open, made by `argv` (unshare)."""
        holder = subprocess.Popen([*argv, "sleep", "infinity"], stderr=subprocess.PIPE, text=True)
        self.holders[node] = holder

        def made() -> bool:
            # a private namespace is what the test needs (CAP_SYS_ADMIN, CAP_NET_ADMIN): no skip
            assert holder.poll() is None, f"{' '.join(argv)}: {holder.stderr.read()}"
            return _comm(holder.pid) == "sleep" and _netns(holder.pid) not in (None, outer)

        _wait_for(f"{node}'s namespaces", made, 10)
        self.namespaces.add(_netns(holder.pid))

    def make_nodes(self) -> None:
        ip, python = _tool("ip"), sys.executable
        hosts = self.root / "etc" / "hosts"
        hosts.write_text(
            "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in ADDRESSES.items())
        )
        # node9: a private mount, network and UTS namespace; node10 shares its mounts
        self._hold(
            "node9",
            ["unshare", "--mount", "--net", "--uts", "--propagation", "private"],
            _netns(os.getpid()),
        )
        self.on("node9", "mount", "--bind", str(hosts), "/etc/hosts")
        # two fake GPUs per node: Slurm wants character devices, so /dev/null bound over files
        for gpu in range(FAKE_GPUS):
            (self.root / "dev" / f"gpu{gpu}").touch()
            self.on("node9", "mount", "--bind", "/dev/null", str(self.root / "dev" / f"gpu{gpu}"))
        node9_net = _netns(self.holders["node9"].pid)
        self._hold("node10", [*self.enter("node9"), "unshare", "--net", "--uts"], node9_net)
        for node in ADDRESSES:
            self.on(node, python, "-c", "import socket, sys; socket.sethostname(sys.argv[1])", node)
            self.on(node, ip, "link", "set", "lo", "up")
        self.on("node9", ip, "link", "add", "hpc9", "type", "veth", "peer", "name", "hpc10")
        self.on("node9", ip, "link", "set", "hpc10", "netns", str(self.holders["node10"].pid))
        for node, link in (("node9", "hpc9"), ("node10", "hpc10")):
            self.on(node, ip, "addr", "add", f"{ADDRESSES[node]}/24", "dev", link)
            self.on(node, ip, "link", "set", link, "up")

    # ---------------------------------------------------------------- daemons
    def _daemon(self, name: str, node: str, argv: list[str]) -> None:
        with open(self.root / "log" / f"{name}.out", "wb") as log:  # the daemon keeps a copy
            process = subprocess.Popen(
                [*self.enter(node), *argv], stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        self.daemons.append((name, process))

    def start(self) -> None:
        self.make_nodes()
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        # --force: the socket's directory is not reachable by every user (pytest's temporary
        # directories are 0700); every client here runs as root.
        munge = self.root / "munge"
        self._daemon("munged", "node9", [
            _tool("munged"), "--foreground", "--force", f"--key-file={key}",
            f"--socket={self.socket}", f"--pid-file={munge / 'munged.pid'}",
            f"--seed-file={munge / 'munged.seed'}", f"--log-file={self.root / 'log/munged.log'}",
        ])  # fmt: skip
        _wait_for("munged's socket", self.socket.exists, 20, self.logs)
        ctl_port, *node_ports = _free_ports(3, self.enter("node9"))
        self.conf.write_text(self._slurm_conf(ctl_port, node_ports))
        devices = f"{self.root}/dev/gpu[0-{FAKE_GPUS - 1}]"
        (self.root / "etc" / "gres.conf").write_text(f"Name=gpu File={devices}\n")
        self._daemon("slurmctld", "node9", [_tool("slurmctld"), "-D"])
        for node in ADDRESSES:
            self._daemon(node, node, [_tool("slurmd"), "-D", "-N", node])
        _wait_for("node9 and node10 idle in sinfo", self._idle, 60, self.logs)

    def _slurm_conf(self, ctl_port: int, node_ports: list[int]) -> str:
        r = self.root
        nodes = "".join(
            f"NodeName={n} NodeAddr={a} Port={p} CPUs=2 Gres=gpu:{FAKE_GPUS} State=UNKNOWN\n"
            for (n, a), p in zip(ADDRESSES.items(), node_ports, strict=True)
        )
        return f"""\
ClusterName=hpcai500test
SlurmctldHost=node9({ADDRESSES["node9"]})
SlurmctldPort={ctl_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmdPidFile={r}/run/%n.pid
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdLogFile={r}/log/%n.log
SlurmctldLogFile={r}/log/slurmctld.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
KillWait=30
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
GresTypes=gpu
{nodes}PartitionName=test Nodes=node[9-10] Default=YES MaxTime=INFINITE State=UP
"""

    def _idle(self) -> bool:
        for name, process in self.daemons:
            assert process.poll() is None, f"{name} exited with {process.returncode}{self.logs()}"
        out = subprocess.run(
            [*self.enter("node9"), "sinfo", "-h", "-N", "-o", "%N %t"],
            capture_output=True, text=True, env=self.env, timeout=30,
        )  # fmt: skip
        return sorted(out.stdout.split("\n")) == ["", "node10 idle", "node9 idle"]

    def srun(self, *argv: str, limit_s: int = SRUN_LIMIT_S) -> subprocess.CompletedProcess:
        """srun on node9 (the login node here), under a hard time limit."""
        return subprocess.run(
            ["timeout", "-k", "10", str(limit_s), *self.enter("node9"), "srun", *argv],
            capture_output=True, text=True, env=self.env, timeout=limit_s + 30,
        )  # fmt: skip

    def sbatch(self, *argv: str, env: dict) -> str:
        """The job sbatch submits on node9, with `env` added to the test's (sbatch's default
        --export=ALL takes it into the job)."""
        run = subprocess.run(
            [*self.enter("node9"), "sbatch", "--parsable", f"--chdir={self.root}",
             f"--output={self.root}/out/job-%j.out", *argv],
            capture_output=True, text=True, env=self.env | env, timeout=60,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr + self.logs()
        return run.stdout.strip().split(";")[0]

    def finished(self, job: str, limit_s: float = 120) -> tuple[str, int]:
        """(state, exit code) of `job` once it has ended, polled every 0.2 s (sbatch --wait
        polls at growing intervals, up to 10 s late)."""
        ended = lambda: not self.on("node9", "squeue", "-h", "-j", job).stdout.strip()  # noqa: E731
        _wait_for(f"job {job}'s end", ended, limit_s, lambda: self.job_output(job))
        shown = self.on("node9", "scontrol", "-o", "show", "job", job).stdout
        fields = dict(field.split("=", 1) for field in shown.split() if "=" in field)
        return fields["JobState"], int(fields["ExitCode"].split(":")[0])

    def job_output(self, job: str) -> str:
        path = self.root / "out" / f"job-{job}.out"
        return path.read_text() if path.exists() else f"(no {path.name})"

    def logs(self) -> str:
        text = ""
        for path in sorted((self.root / "log").iterdir()):
            text += f"\n--- {path.name}\n" + "\n".join(path.read_text().splitlines()[-15:])
        return text

    # ---------------------------------------------------------------- teardown
    def stop(self) -> None:
        """Every daemon by its pid (SIGTERM, then SIGKILL), then whatever is left inside the
        test's network namespaces (slurmstepd, tasks), then the namespaces' holders."""
        for _, process in reversed(self.daemons):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for _, process in reversed(self.daemons):
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        holders = {holder.pid for holder in self.holders.values()}
        for _ in range(20):
            left = [
                int(pid)
                for pid in os.listdir("/proc")
                if pid.isdigit() and int(pid) not in holders and _netns(int(pid)) in self.namespaces
            ]
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        for holder in reversed(list(self.holders.values())):
            holder.kill()
            holder.wait()
            holder.stderr.close()


@pytest.fixture(scope="module")
def real_slurm(tmp_path_factory):
    missing = [
        n for n in ("slurmd", "slurmctld", "munged") if not shutil.which(n, path=SEARCH_PATH)
    ]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (apt-get install slurmd slurmctld munge)")
    if os.geteuid() != 0:
        pytest.skip("a real Slurm cluster needs root here (namespaces, slurmd as root)")
    for client in ("srun", "sinfo", "nsenter", "unshare"):
        _tool(client)
    slurm = RealSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        slurm.start()
        yield slurm
    finally:
        slurm.stop()


def test_slurm_orders_node9_before_node10_and_the_cluster_follows(real_slurm):
    sinfo = real_slurm.on("node9", "sinfo", "-h", "-o", "%N %t")
    assert sinfo.stdout.split() == ["node[9-10]", "idle"], sinfo.stdout
    # what Slurm itself tells each task (the text sort would put node10 first)
    assert sorted(["node9", "node10"]) == ["node10", "node9"]
    seen = real_slurm.srun(
        "-N2", "-n2", "-l", "sh", "-c",
        'echo "$SLURM_PROCID $SLURMD_NODENAME $(hostname) $SLURM_STEP_NODELIST"',
    )  # fmt: skip
    assert seen.returncode == 0, seen.stderr + real_slurm.logs()
    lines = sorted(line.split(": ", 1)[1] for line in seen.stdout.splitlines())
    assert lines == ["0 node9 node9 node[9-10]", "1 node10 node10 node[9-10]"], seen.stdout

    out = real_slurm.root / "out"
    plan = real_slurm.srun(
        "-N2", "-n2", f"--output={out}/cluster-%t.json", CLI, "cluster", "--json"
    )
    assert plan.returncode == 0, plan.stderr + real_slurm.logs()
    first, second = (json.loads((out / f"cluster-{t}.json").read_text()) for t in (0, 1))
    port = first["address"].rpartition(":")[2]
    assert first["found"] == "Slurm" and first["index"] == 0 and first["host"] == "node9"
    assert first["workers"] == [f"node9:{port}", f"node10:{port}"]  # Slurm's order
    assert first["ports"]["source"] == "SLURM_JOB_ID" and first["port_free"] is True
    assert second["index"] == 1 and second["host"] == "node10"
    assert second["address"] == f"node10:{port}" and second["workers"] == first["workers"]
    assert first["gpus"] == second["gpus"] == [] and first["collective"] == "ring"


def test_a_real_srun_trains_on_two_nodes_into_one_record(real_slurm):
    """Two TensorFlow workers, one per node, joined over gRPC between the nodes' namespaces:
    about 7 s on 2 cores (start-up, one epoch of the tiny preset, evaluation)."""
    out, logs = real_slurm.root / "runs", real_slurm.root / "out"
    run = real_slurm.srun(
        "-N2", "-n2", "--kill-on-bad-exit=1", f"--output={logs}/train-%j-%t.log",
        CLI, "train", "image_classification", "--preset", "tiny",
        "--set", "training.epochs=1", "--out", str(out), "--power-hz", "0", "--no-tensorboard",
    )  # fmt: skip
    tasks = sorted(logs.glob("train-*-*.log"))
    output = "".join(f"\n--- {path.name}\n{path.read_text()[-3000:]}" for path in tasks)
    assert run.returncode == 0, f"srun: {run.returncode}{run.stderr}{output}{real_slurm.logs()}"
    (job,) = {path.name.split("-")[1] for path in tasks}
    # each node's own slurmd started its task of the step
    for node in ("node9", "node10"):
        slurmd_log = (real_slurm.root / "log" / f"{node}.log").read_text()
        assert f"launch task StepId={job}.0 request" in slurmd_log, node
    records = sorted(out.glob("*/record.json"))
    assert len(records) == 1, records  # task 0 writes it, task 1 none
    record = json.loads(records[0].read_text())
    assert record["status"] == "completed"
    # L3 names both nodes, in Slurm's order (a string sort would put node10 first)
    l3 = record["layers"]["L3"]
    assert l3["nodes"] == ["node9", "node10"]
    assert l3["cluster_from"] == "Slurm" and l3["collective_requested"] == "auto"
    assert "CommunicationImplementation.RING" in l3["collective_implementation"]
    assert record["layers"]["L6"]["workers"] == 2 and record["layers"]["L1"]["workers"] == 2
    assert record["layers"]["L6"]["global_batch"] == 2 * record["layers"]["L6"]["batch_per_replica"]


def _task_environments(real_slurm, name: str, *options: str) -> list[dict]:
    """Each task's environment under `srun OPTIONS`, by SLURM_PROCID."""
    out = real_slurm.root / "out"
    dump = "import json, os; print(json.dumps(dict(os.environ)))"
    run = real_slurm.srun(*options, f"--output={out}/{name}-%t.json", sys.executable, "-c", dump)
    assert run.returncode == 0, run.stderr + real_slurm.logs()
    return [json.loads(path.read_text()) for path in sorted(out.glob(f"{name}-*.json"))]


@pytest.mark.parametrize(
    "options, layout",
    [
        (["--gpus-per-task=1"], "bound to this task by Slurm: every visible GPU"),
        (["--gpus-per-node=2"], "slice {local} of the 2 GPUs its node's 2 tasks share"),
    ],
    ids=["gpus-per-task", "gpus-per-node"],
)
def test_real_slurm_gpu_variables_give_each_task_its_gpu(real_slurm, options, layout):
    """Two fake GPUs per node (gres.conf): the variables Slurm gives 2 tasks per node, read
    by the project's own code with the node's GPU count set to 2 (there is no NVML here)."""
    from hpcai500_tf.cluster import slurm
    from hpcai500_tf.cluster import workers as cluster_workers

    name = options[0].strip("-").split("=")[0]
    tasks = _task_environments(real_slurm, name, "-N2", "--ntasks-per-node=2", *options)
    assert [(t["SLURMD_NODENAME"], t["SLURM_LOCALID"]) for t in tasks] == [
        ("node9", "0"), ("node9", "1"), ("node10", "0"), ("node10", "1")
    ]  # fmt: skip
    assert {t["SLURM_GPUS_ON_NODE"] for t in tasks} == {"2"}
    bound = options == ["--gpus-per-task=1"]
    # --gpus-per-task=1: each task sees its own GPU; --gpus-per-node=2: each sees both.
    # srun (22.05) does not pass SLURM_GPUS_PER_TASK to the tasks: the project's fallback,
    # fewer visible GPUs than the node has, is what finds the binding.
    expected = ["0", "1", "0", "1"] if bound else ["0,1"] * 4
    assert [t["CUDA_VISIBLE_DEVICES"] for t in tasks] == expected
    assert all("SLURM_GPUS_PER_TASK" not in t for t in tasks)
    plans = [
        slurm.SlurmCluster.from_environment(
            t, cluster_workers.visible_gpus(t, FAKE_GPUS), FAKE_GPUS
        )
        for t in tasks
    ]
    port = plans[0].ports.ports[0]
    addresses = (f"node9:{port}", f"node9:{port + 1}", f"node10:{port}", f"node10:{port + 1}")
    for index, plan in enumerate(plans):
        assert plan.index == index and plan.addresses == addresses
        assert plan.gpus == (str(plan.local_index),)  # GPU 0 or 1 of its node, never both
        assert plan.gpu_layout == layout.format(local=plan.local_index)


# ---------------------------------------------------------------- tools/slurm_train.sbatch
SBATCH = Path(__file__).resolve().parents[1] / "tools" / "slurm_train.sbatch"
# the job shape every sbatch test asks for: both nodes, with their two fake GPUs each
JOB = ("--nodes=2", f"--gpus-per-node={FAKE_GPUS}", "--time=10")
PROBE = f"""\
#!{sys.executable}
# stands in for hpcai500-tf: what Slurm gave this task, into PROBE_OUT; task PROBE_FAIL_TASK
# exits 2 at once (as a one-line refusal does), the others then sleep PROBE_SLEEP_S
import json, os, socket, sys, time
env = dict(os.environ)
name = f"{{env['PROBE_OUT']}}/probe-{{env['SLURM_JOB_ID']}}-{{env['SLURM_PROCID']}}.json"
with open(name, "w") as out:
    json.dump({{"argv": sys.argv[1:], "host": socket.gethostname(), "env": env}}, out)
if env["SLURM_PROCID"] == env.get("PROBE_FAIL_TASK"):
    sys.exit(2)
time.sleep(float(env.get("PROBE_SLEEP_S", "0")))
"""


def _probe_env(tmp_path: Path, **settings: str) -> dict:
    """PATH with the probe named hpcai500-tf first, PROBE_OUT, and `settings`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "hpcai500-tf").write_text(PROBE)
    (bin_dir / "hpcai500-tf").chmod(0o755)
    (tmp_path / "probes").mkdir()
    return {"PATH": f"{bin_dir}:{SEARCH_PATH}", "PROBE_OUT": str(tmp_path / "probes")} | settings


def _probes(tmp_path: Path, job: str) -> list[dict]:
    """What each task of `job` saw, by SLURM_PROCID."""
    found = [json.loads(p.read_text()) for p in (tmp_path / "probes").glob(f"probe-{job}-*.json")]
    return sorted(found, key=lambda probe: int(probe["env"]["SLURM_PROCID"]))


LAYOUTS = {  # name: (the sbatch's variables, tasks per node, Slurm binds the GPUs)
    "tensorflow-per-node": ({}, 1, False),
    "tensorflow-per-gpu": ({"TASK_PER": "gpu"}, FAKE_GPUS, False),
    "tensorflow-per-gpu-slurm-bound": ({"TASK_PER": "gpu", "GPU_BIND": "slurm"}, FAKE_GPUS, True),
    "pytorch": ({"FRAMEWORK": "pytorch"}, FAKE_GPUS, False),
    "pytorch-slurm-bound": ({"FRAMEWORK": "pytorch", "GPU_BIND": "slurm"}, FAKE_GPUS, True),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_sbatch_starts_the_tasks_of_its_layout_on_their_gpus(real_slurm, tmp_path, name):
    """The shipped sbatch under the real sbatch, hpcai500-tf replaced by a probe: tasks per
    node, each task's SLURM_PROCID, node and GPUs, as the project's own code reads them
    (the node's GPU count given as 2: there is no NVML here)."""
    from hpcai500_tf.cluster import slurm
    from hpcai500_tf.cluster import workers as cluster_workers
    from hpcai500_tf.cluster.devices import WORKER_GPUS
    from hpcai500_tf.pytorch.distributed import workers_from_environment

    variables, per_node, bound = LAYOUTS[name]
    job = real_slurm.sbatch(
        *JOB, str(SBATCH), "/data/imagenet", "/shared/runs", "--set", "training.epochs=2",
        env=_probe_env(tmp_path, **variables),
    )  # fmt: skip
    ended = real_slurm.finished(job)
    assert ended == ("COMPLETED", 0), f"{ended}{real_slurm.job_output(job)}{real_slurm.logs()}"
    tasks = _probes(tmp_path, job)
    total = 2 * per_node
    assert [int(t["env"]["SLURM_PROCID"]) for t in tasks] == list(range(total))
    assert [t["host"] for t in tasks] == ["node9"] * per_node + ["node10"] * per_node
    pytorch = variables.get("FRAMEWORK") == "pytorch"
    for index, task in enumerate(tasks):
        env, local = task["env"], index % per_node
        assert env["SLURM_LOCALID"] == str(local) and env["SLURMD_NODENAME"] == task["host"]
        assert env["SLURM_STEP_NUM_TASKS"] == str(total)
        assert env["SLURM_STEP_TASKS_PER_NODE"] == f"{per_node}(x2)"
        framework = ["--framework", "pytorch"] if pytorch else []
        assert task["argv"] == [
            "train", "image_classification", *framework, "--preset", "reference",
            "--data", "/data/imagenet", "--resume-or-start", f"/shared/runs/slurm-{job}",
            "--set", "training.epochs=2",
        ]  # fmt: skip
        # Slurm's own binding: this task's GPU only; otherwise every GPU of its node
        # (--gpu-bind=none: Slurm sets no CUDA_VISIBLE_DEVICES, so CUDA sees the node's)
        assert env.get("CUDA_VISIBLE_DEVICES") == (
            str(local) if bound else None if per_node > 1 else "0,1"
        )
        visible = cluster_workers.visible_gpus(env, FAKE_GPUS)
        # each node's 2 CPUs shared by its tasks; 1 per task is refused for a GPU task (the
        # input pipeline cannot feed it), so the GPUs are checked as with 8 each
        assert env["SLURM_CPUS_PER_TASK"] == str(2 // per_node)
        env |= {"SLURM_CPUS_PER_TASK": "8"}
        if pytorch:
            workers = workers_from_environment(env)
            assert (workers.world_size, workers.rank, workers.local_rank) == (total, index, local)
            # init_process_group computes on GPU local_rank of several visible, else on the one
            assert len(visible) == (1 if bound else FAKE_GPUS)
            continue
        plan = slurm.SlurmCluster.from_environment(env, visible, FAKE_GPUS)
        assert plan.index == index and plan.host == task["host"]
        if per_node == 1:
            assert plan.gpus == ("0", "1") and plan.gpu_layout.startswith("the only task")
        else:
            assert plan.gpus == (str(local),)
            share = cluster_workers.slurm_gpu_variables(env, plan, visible)
            assert share == ({} if bound else {WORKER_GPUS: str(local)})


GPU_NAMES = (
    "CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE",
    "SLURMD_TRES_BIND", "SLURM_TRES_BIND", "SLURM_TRES_PER_TASK", "SLURM_GPUS_PER_TASK",
)  # fmt: skip


def test_a_task_slurm_binds_a_gpu_to_sees_these_variables(real_slurm, tmp_path):
    """What Slurm 22.05 gives a task of `srun --gpus-per-task=1` (the sbatch's GPU_BIND=slurm),
    2 tasks on each node of 2 GPUs: its own GPU in CUDA_VISIBLE_DEVICES and SLURM_STEP_GPUS,
    the node's count in SLURM_GPUS_ON_NODE, the binding in SLURMD_TRES_BIND; neither
    SLURM_GPUS_PER_TASK nor SLURM_TRES_PER_TASK nor SLURM_TRES_BIND reaches the task. The
    unbound form (--gpus-per-node=2 --gpu-bind=none) says gpu:none there."""
    env = _probe_env(tmp_path, TASK_PER="gpu")
    seen = {}
    for bind in ("slurm", "project"):
        job = real_slurm.sbatch(*JOB, str(SBATCH), "/data", env=env | {"GPU_BIND": bind})
        ended = real_slurm.finished(job)
        assert ended == ("COMPLETED", 0), f"{ended}{real_slurm.job_output(job)}"
        seen[bind] = [{n: t["env"].get(n) for n in GPU_NAMES} for t in _probes(tmp_path, job)]
    (real_slurm.root / "out" / "gpu-task-variables.json").write_text(json.dumps(seen, indent=1))
    for local, task in zip([0, 1, 0, 1], seen["slurm"], strict=True):
        assert task == {
            "CUDA_VISIBLE_DEVICES": str(local), "SLURM_STEP_GPUS": str(local),
            "SLURM_JOB_GPUS": "0,1", "SLURM_GPUS_ON_NODE": "2",
            "SLURMD_TRES_BIND": "gpu:per_task:1", "SLURM_TRES_BIND": None,
            "SLURM_TRES_PER_TASK": None, "SLURM_GPUS_PER_TASK": None,
        }  # fmt: skip
    for task in seen["project"]:
        assert task["CUDA_VISIBLE_DEVICES"] is None and task["SLURM_STEP_GPUS"] is None
        assert task["SLURM_GPUS_ON_NODE"] == "2" and task["SLURMD_TRES_BIND"] == "gpu:none"


def test_one_task_exiting_2_ends_the_whole_job_at_once(real_slurm, tmp_path):
    """--kill-on-bad-exit=1: task 1 refuses (exit 2), the other three would sleep 120 s."""
    env = _probe_env(tmp_path, TASK_PER="gpu", PROBE_FAIL_TASK="1", PROBE_SLEEP_S="120")
    start = time.monotonic()
    job = real_slurm.sbatch(*JOB, str(SBATCH), "/data", env=env)
    state, code = real_slurm.finished(job, limit_s=60)
    took = time.monotonic() - start
    output = real_slurm.job_output(job)
    assert took < 30, f"the job took {took:.0f} s{output}"
    assert state == "FAILED" and code != 0, output  # srun's status (2, or 143: SIGTERM's)
    # task 1 ran (tasks still starting when it failed may never have written their probe)
    assert "1" in {t["env"]["SLURM_PROCID"] for t in _probes(tmp_path, job)}, output
    assert "task 1: Exited with exit code 2" in output, output


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["tensorflow", "pytorch"])
def test_scancel_stops_a_two_task_run_mid_epoch_within_killwait(real_slurm, tmp_path, framework):
    """The shipped sbatch with a real `hpcai500-tf train` (the tiny preset, 200 epochs: the
    wrapper on PATH notes each task's pid and execs the CLI with these options in place of
    the sbatch's reference ones), one task per node, scancelled mid-epoch: seconds from
    scancel (SIGTERM to every task and the batch script, which passes it to srun) to the last
    task's exit, under KillWait (30 s here, Slurm's default), a `stopped` record, and every
    task exits 143. PyTorch's too: Slurm signals its data process as well (proctrack), which
    must outlive the stop. About 40 s on 2 cores each."""
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    out.mkdir()
    (bin_dir / "hpcai500-tf").write_text(
        f'#!/bin/sh\necho "$$" > "{out}/pid-$SLURM_PROCID"\n'
        # the fake gres GPUs hidden from the run, which trains on the CPUs TensorFlow has (a
        # task counting Slurm's GPUs is refused: TensorFlow sees none); the stop is the same
        "unset SLURM_GPUS_ON_NODE SLURM_JOB_GPUS SLURM_STEP_GPUS SLURMD_TRES_BIND\n"
        f"exec {CLI} train image_classification --preset tiny --set training.epochs=200 "
        f'--framework {framework} --out "{out}/runs" --power-hz 0 --no-tensorboard\n'
    )
    (bin_dir / "hpcai500-tf").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{SEARCH_PATH}"}
    job = real_slurm.sbatch(*JOB, str(SBATCH), "/data", env=env)
    _wait_for(
        "the end of epoch 1", lambda: "eval after epoch 1" in real_slurm.job_output(job), 180,
        lambda: real_slurm.job_output(job) + real_slurm.logs(),
    )  # fmt: skip
    time.sleep(0.5)  # into epoch 2
    pids = [int((out / f"pid-{task}").read_text()) for task in (0, 1)]
    start = time.monotonic()
    real_slurm.on("node9", "scancel", job)
    exits = {}
    while len(exits) < 2 and time.monotonic() - start < 60:
        for pid in set(pids) - set(exits):
            if not Path(f"/proc/{pid}").exists():
                exits[pid] = time.monotonic() - start
        time.sleep(0.05)
    last = max(exits.values(), default=float("inf"))
    state, code = real_slurm.finished(job, limit_s=60)
    output = real_slurm.job_output(job)
    # the batch script waited for srun's step and exits with its status (143: SIGTERM's stop)
    assert (state, code) == ("CANCELLED", 143), f"{state} {code}{output}"
    exited = {task: round(exits.get(pid, -1), 1) for task, pid in enumerate(pids)}
    print(f"scancel to the last task's exit: {last:.1f} s (by task: {exited})\n{output[-2500:]}")
    assert len(exits) == 2 and last < 30, f"{exits}{output}"
    (record,) = (json.loads(path.read_text()) for path in out.glob("runs/*/record.json"))
    assert record["status"] == "stopped", output
    assert record["warnings"][0].startswith("stopped by SIGTERM"), record["warnings"]
    for task, node in ((0, "node9"), (1, "node10")):
        assert f"{node}: task {task}: Exited with exit code 143" in output, output


def _segmented_job_past_epoch_1(
    real_slurm, tmp_path: Path, settings: str, linger_s: int = 0
) -> str:
    """The shipped sbatch running a real tiny `train` (`settings` added) in its
    --resume-or-start RUN_DIR under TMP/out/runs, two tasks, once epoch 1 is evaluated. With
    `linger_s`, each task stays up to that long after its `train` ended (until a SIGTERM), with
    `train`'s exit code, having made TMP/lingering-<its SLURM_PROCID>: the step is still running
    after the run stopped."""
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    out.mkdir()
    train = (
        f"{CLI} train image_classification --preset tiny {settings} "
        '--power-hz 0 --no-tensorboard --resume-or-start "$dir"\n'
    )
    if linger_s:  # a no-op trap: this shell outlives the stop signals, `train` gets its own
        lingering = f'touch "{tmp_path}/lingering-$SLURM_PROCID"'
        train = (
            f"trap : USR1 TERM\n{train}code=$?\n{lingering}\n"
            f"sleep {linger_s} & wait $!\nexit $code\n"
        )
    (bin_dir / "hpcai500-tf").write_text(
        "#!/bin/sh\n"
        "unset SLURM_GPUS_ON_NODE SLURM_JOB_GPUS SLURM_STEP_GPUS SLURMD_TRES_BIND\n"
        'while [ $# -gt 0 ]; do [ "$1" = --resume-or-start ] && dir=$2; shift; done\n'
        + ("" if linger_s else "exec ")
        + train
    )
    (bin_dir / "hpcai500-tf").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{SEARCH_PATH}"}
    job = real_slurm.sbatch(*JOB, str(SBATCH), "/data", str(out / "runs"), env=env)
    _wait_for(
        "the end of epoch 1", lambda: "eval after epoch 1" in real_slurm.job_output(job), 180,
        lambda: real_slurm.job_output(job) + real_slurm.logs(),
    )  # fmt: skip
    return job


@pytest.mark.slow
def test_a_job_warned_before_its_time_limit_requeues_itself_and_completes(real_slurm, tmp_path):
    """The shipped sbatch with a real `hpcai500-tf train` (the tiny preset; the wrapper keeps
    the sbatch's --resume-or-start RUN_DIR), two tasks: SIGUSR1 to the batch script mid-run
    (what --signal=B:USR1@300 sends before the time limit) stops both tasks after the same
    step at a checkpoint, the script requeues the job, and its second start resumes the run
    to a completed record of two segments."""
    out = tmp_path / "out"
    job = _segmented_job_past_epoch_1(
        real_slurm, tmp_path, "--set training.epochs=30 --set training.checkpoint_every=0"
    )
    real_slurm.on("node9", "scancel", "--signal=USR1", "--batch", job)
    state, code = real_slurm.finished(job, limit_s=600)
    output = real_slurm.job_output(job)
    assert (state, code) == ("COMPLETED", 0), f"{state} {code}{output}"
    assert "segment 1 stopped at its checkpoint; requeued" in output, output
    assert "not requeued: no SIGUSR1 came" in output, output
    record = json.loads((out / "runs" / f"slurm-{job}" / "record.json").read_text())
    assert record["status"] == "completed", record["warnings"]
    assert len(record["timeline"]["segments"]) == 2
    assert record["timeline"]["epochs"][-1]["examples"] == 30 * 256


@pytest.mark.slow
def test_a_job_cancelled_after_its_warning_is_not_requeued(real_slurm, tmp_path):
    """scancel after Slurm's warning (SIGUSR1), while its step is still running: the job is not
    requeued (a person or the scheduler ended it; only the time limit's stop is continued).
    The run stops at its checkpoint for the warning; its tasks then stay up (`linger_s`) so
    that the scancel lands before the script decides, however loaded the machine (a fixed
    pause lost that race to a fast stop under two test processes)."""
    out = tmp_path / "out"
    job = _segmented_job_past_epoch_1(
        real_slurm, tmp_path, "--set training.epochs=200", linger_s=60
    )
    real_slurm.on("node9", "scancel", "--signal=USR1", "--batch", job)
    _wait_for(
        "both tasks' runs stopped", lambda: len(list(tmp_path.glob("lingering-*"))) == 2, 120,
        lambda: real_slurm.job_output(job) + real_slurm.logs(),
    )  # fmt: skip
    real_slurm.on("node9", "scancel", job)
    state, code = real_slurm.finished(job, limit_s=120)
    time.sleep(3)  # a requeued job would be pending again by now
    output = real_slurm.job_output(job)
    assert not real_slurm.on("node9", "squeue", "-h", "-j", job).stdout.strip(), output
    assert "requeued" not in output.replace("not requeued", ""), output
    assert "not requeued: cancelled: SIGTERM came" in output, output
    assert "run stopped: stopped by SIGUSR1" in output, output  # the warning stopped it
    assert state == "CANCELLED", f"{state} {code}{output}"
    record = json.loads((out / "runs" / f"slurm-{job}" / "record.json").read_text())
    assert record["status"] == "stopped", record["warnings"]
