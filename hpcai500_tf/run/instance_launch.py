"""Running `train BENCHMARK --instances M`: M instances started together, watched, stopped as
one, and their throughput record written when every one has ended.

Locally each instance is one `hpcai500-tf train` process (a `--workers` launcher where it has
several workers), in a process group of its own, writing its run under PARENT/instance-I/ and
its console to PARENT/instance-I.log. The instances are independent: one that fails, diverges
or is killed ends alone and the others run on (its member says how it ended). SIGTERM, SIGINT
and SIGHUP (as SIGTERM) to this process are passed to every instance at once, each writes its
stopped record, and the throughput record says the instances were stopped: one stop. Power is
sampled here, once for the machine, over the whole window.

Under srun each task runs its instance's `train` with its group's step variables
(`instances.slurm_group`; an ensemble member also its index, `ensemble.member_arguments`); the
chief of each instance leaves its member note beside the runs, and whichever chief ends last
writes the throughput record (an ensemble's form and rule where `--ensemble` is given) and
says its score, its energy each node's own block over the window (each node's first task
samples it), else the members' records' added over their disjoint nodes
(run/window_energy.py). A scancel's SIGTERM reaches every task: each passes it on and waits
for its instance (run/slurm_task.py), so the stopped members are named in a throughput record
of status `stopped`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from hpcai500_tf import __version__
from hpcai500_tf import record as record_io
from hpcai500_tf.cluster import instances as plans
from hpcai500_tf.errors import UserError
from hpcai500_tf.files import open_for_append
from hpcai500_tf.run import ensemble, slurm_task, throughput, window_energy
from hpcai500_tf.run.stop import FORWARDED

STOP_GRACE_S = 60.0  # for the instances to write their stopped records after a signal
KILL_WAIT_S = 10.0
MEMBER_NOTE = "instance-{index}.member.json"  # under srun: how one instance ended
ERROR_PREFIX = "hpcai500-tf: error: "


def check_arguments(args) -> None:
    """What `--instances` cannot go with, refused in one line before anything starts."""
    if args.resume:
        raise UserError(
            "--instances starts new runs: resume each instance's run directory on its own "
            "(train --resume PARENT/instance-I/RUN_DIR)"
        )
    if args.run_dir:
        raise UserError("--run-dir is set by the launchers, not with --instances")
    if os.environ.get("TF_CONFIG"):
        raise UserError("TF_CONFIG is set: --instances makes each instance's cluster itself")


def child_arguments(args, seed: int, workers: int, out: Path, index: int = 0) -> list[str]:
    """One instance's `train` arguments: the user's, its seed (an ensemble member's sample),
    its workers, its directory."""
    from hpcai500_tf.run import launch  # the forwarding `--workers` already does

    forwarded = [*launch.worker_args(args), "--set", f"training.seed={seed}"]
    forwarded += ensemble.member_arguments(args, index)
    if workers > 1:
        forwarded += ["--workers", str(workers)]
    return [sys.executable, "-m", "hpcai500_tf.cli", "train", *forwarded, "--out", str(out)]


def parent_directory(out: str, setup, instances: int, environ=os.environ) -> Path:
    """The new directory that holds the instances and the throughput record; under srun one
    name every task derives alike (the job and step), made by the first."""
    from hpcai500_tf.run.directory import RunDirectory

    label = f"{setup.preset}-x{instances}"
    if environ.get("SLURM_JOB_ID"):
        step = environ.get("SLURM_STEP_ID", "0")
        restart = environ.get("SLURM_RESTART_COUNT", "0")  # a requeued job's steps start anew
        step += f"-r{restart}" if restart != "0" else ""
        path = Path(out) / f"{setup.benchmark.name}-{label}-{environ['SLURM_JOB_ID']}.{step}"
        path.mkdir(parents=True, exist_ok=True)
        return path
    return RunDirectory.new(out, setup.benchmark.name, label).path


def run_dir_of(instance_dir: Path) -> str | None:
    """The run directory an instance made under its own directory (relative to the parent),
    or None where it made none."""
    try:
        made = sorted(p for p in instance_dir.iterdir() if p.is_dir())
    except OSError:
        return None
    return str(made[0].relative_to(instance_dir.parent)) if made else None


def ended_words(code: int | None) -> str:
    if code is None:
        return "did not end"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return "exited 0" if code == 0 else f"exited with code {code}"


def train(args) -> int:
    """`train ... --instances M`: locally, or this task's instance under srun; every check
    before any instance starts."""
    from hpcai500_tf import config
    from hpcai500_tf.cluster import workers as cluster

    check_arguments(args)
    setup = config.run_setup(args.benchmark, args.preset, args.set, args.config)
    if cluster.under_slurm():
        if args.workers is not None:
            raise UserError("--workers is for one machine: under srun the step's tasks are")
        group = plans.slurm_group(args.instances, os.environ)
        if args.meter_log and group.instances > 1:
            raise UserError(
                f"--meter-log: one node meter's log cannot stand for the {group.instances} "
                "instances' nodes under srun (each would count it as its own); leave it out "
                "(--power-hz samples each node)"
            )
        return run_slurm_task(args, setup, group)
    gpus = cluster.visible_gpus()  # each instance gets its share as CUDA_VISIBLE_DEVICES
    plan = plans.local_plan(args.instances, args.workers, gpus, os.environ)
    if plan.workers_per_instance > 1:
        cluster.resolve_collective(setup.communication.collective, gpus)
    return run_local(args, setup, plan)


class _Stop:
    """The first forwarded signal, passed to every instance started; later ones ignored."""

    def __init__(self, processes: list[subprocess.Popen]):
        self.processes, self.received, self.at = processes, None, 0.0

    def __call__(self, signum, frame) -> None:
        if self.received is not None:
            return
        self.received, self.at = signum, time.monotonic()
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(FORWARDED[signum])


def run_local(args, setup, plan: plans.LocalPlan) -> int:
    parent = parent_directory(args.out, setup, plan.instances)
    seeds = ensemble.seeds(args, setup.training.seed, plan.instances) or plans.seeds(
        setup.training.seed, plan.instances
    )
    processes: list[subprocess.Popen] = []
    stop = _Stop(processes)
    previous = {signum: signal.signal(signum, stop) for signum in FORWARDED}
    from hpcai500_tf.run.energy import start_power_sampling

    sampler, notes = start_power_sampling(args.power_hz)  # the machine's, over the window
    logs = []
    try:
        print(
            f"starting {plan.instances} instance(s) of {plan.workers_per_instance} worker(s) "
            f"each in {parent}",
            flush=True,
        )
        for index, (seed, env) in enumerate(zip(seeds, plan.environments, strict=True)):
            if stop.received is not None:
                break
            out = parent / f"instance-{index}"
            out.mkdir()
            log = open_for_append(parent / f"instance-{index}.log")
            logs.append(log)
            command = child_arguments(args, seed, plan.workers_per_instance, out, index)
            processes.append(
                subprocess.Popen(
                    command, env={**os.environ, **env}, stdout=log, stderr=log,
                    process_group=0,
                )
            )  # fmt: skip
            print(f"instance {index}: pid {processes[-1].pid}, seed {seed}", flush=True)
        _watch(processes, stop)
    finally:
        for process in processes:  # a stop or an error here: none outlives this process
            if process.poll() is None:
                process.kill()
                process.wait()
        for log in logs:
            log.close()
        if sampler is not None:
            sampler.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    members = [
        _member(parent, index, seeds[index], processes[index] if index < len(processes) else None)
        for index in range(plan.instances)
    ]
    refused = _all_refused(parent, members)
    if refused is not None:  # bad input every instance refused: nothing ran, nothing kept
        shutil.rmtree(parent, ignore_errors=True)
        raise UserError(refused)
    data = _record(setup, plan.instances, plan.workers_per_instance, members, "local", stop)
    ensemble.mark(data, args)
    window, data["energy"], more = window_energy.sampled(
        parent, data["members"], sampler, notes, args.power_hz, args.meter_log
    )
    data["window"] = dict(zip(("start", "stop"), window, strict=True))
    data["warnings"] += more
    path = record_io.write_atomic(parent / throughput.FILE, data)
    return _report(path, data, processes, stop)


def _watch(processes: list[subprocess.Popen], stop: _Stop) -> None:
    """Until every instance has ended; after a signal, STOP_GRACE_S for them to write their
    stopped records, then SIGKILL."""
    reported: set[int] = set()
    while any(p.poll() is None for p in processes):
        if stop.received is not None and time.monotonic() - stop.at > STOP_GRACE_S:
            for process in processes:
                if process.poll() is None:
                    process.kill()
            deadline = time.monotonic() + KILL_WAIT_S
            while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
                time.sleep(0.05)
            break
        _say_ended(processes, reported)
        time.sleep(0.1)
    _say_ended(processes, reported)


def _say_ended(processes: list[subprocess.Popen], reported: set[int]) -> None:
    for index, process in enumerate(processes):
        code = process.poll()
        if code is not None and index not in reported:
            reported.add(index)
            said = error_line(Path(process.args[-1]).with_suffix(".log")) if code else ""
            print(f"instance {index}: {ended_words(code)}{f': {said}' if said else ''}", flush=True)


def error_line(log: Path) -> str:
    """The one-line error an instance ended with (its last `hpcai500-tf: error:` line), or ""."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    said = [line for line in lines if line.startswith(ERROR_PREFIX)]
    return said[-1].removeprefix(ERROR_PREFIX)[:300] if said else ""


def _all_refused(parent: Path, members: list[dict]) -> str | None:
    """The line to refuse the command with where every instance ended with a user error (exit
    2) before any began its timed run: the same bad input, said once."""
    if not members or any(m["exit_code"] != 2 for m in members):
        return None
    seen = [throughput.read_member(parent, m) for m in members]
    if any(m["run_start"] is not None for m in seen):
        return None
    said = error_line(parent / "instance-0.log")
    return said or "every instance ended with exit code 2 before its run began (their logs)"


def _member(parent: Path, index: int, seed: int, process) -> dict:
    code = None if process is None else process.returncode
    return {
        "index": index,
        "seed": seed,
        "run_dir": run_dir_of(parent / f"instance-{index}"),
        "exit_code": code,
        "ended": "never started (stopped first)" if process is None else ended_words(code),
        "hosts": [socket.gethostname()],
    }


def _record(setup, instances: int, per_instance: int, members: list[dict], placement, stop):
    status = "stopped" if stop is not None and stop.received is not None else "completed"
    warnings = []
    if status == "stopped":
        warnings.append(f"stopped by {signal.Signals(stop.received).name}: every instance")
    return {
        "schema_version": throughput.SCHEMA_VERSION,
        "kind": throughput.KIND,
        "form": "weak_scaling",
        "status": status,
        "benchmark": setup.benchmark.name,
        "preset": setup.preset,
        "instances": instances,
        "workers_per_instance": per_instance,
        "placement": placement,
        "rule": dict(throughput.RULE),
        "members": members,
        "window": {"start": None, "stop": None},
        "energy": {},
        "warnings": warnings,
        "source": {"tool": "hpcai500-tf", "tool_version": __version__},
    }


def _report(path: Path, data: dict, processes, stop) -> int:
    """The throughput line (or why there is none) and the exit code: 0 where every instance
    exited 0, 128 + the signal where one stopped them all, else 1."""
    print(f"throughput record: {path}", flush=True)
    _say_score(path, data)
    if stop.received is not None:
        return 128 + stop.received
    return 0 if processes and all(p.returncode == 0 for p in processes) else 1


def _say_score(path: Path, data: dict) -> None:
    """The completed throughput record's score in one line (an ensemble's: its quality and
    Valid FLOPS), or why it has none."""
    if data["status"] != "completed":
        return
    try:
        one = throughput.score(path, data)
    except UserError as error:
        print(f"no throughput score: {error}", flush=True)
    else:
        print(one.summary(), flush=True)


def run_slurm_task(args, setup, group: plans.SlurmGroup) -> int:
    """This task's instance under srun: its `train` with its group's step variables; its
    chief then leaves the member note, and the last chief writes the throughput record."""
    parent = parent_directory(args.out, setup, group.instances)
    seeds = ensemble.seeds(args, setup.training.seed, group.instances) or plans.seeds(
        setup.training.seed, group.instances
    )
    seed = seeds[group.instance]
    out = parent / f"instance-{group.instance}"
    out.mkdir(exist_ok=True)
    command = child_arguments(args, seed, 1, out, group.instance)
    env = plans.apply_group(dict(os.environ), group)
    print(
        f"instance {group.instance} of {group.instances} on {', '.join(group.nodes)} "
        f"(task {group.index_in_group} of {group.tasks_per_instance}; seed {seed})",
        flush=True,
    )
    # this node's energy over the window (one instance's meter log: read by its record)
    sampling = None if args.meter_log else window_energy.node_sampling(args.power_hz)
    started = time.monotonic()
    code, stopped_by = slurm_task.run_instance(command, env)  # a scancel leaves the task here
    ran_s = time.monotonic() - started
    if group.chief:
        by = None if stopped_by is None else signal.Signals(stopped_by).name
        ended = ended_words(code) if by is None else f"stopped by {by}: {ended_words(code)}"
        note = {"index": group.instance, "seed": seed, "run_dir": run_dir_of(out),
                "exit_code": code, "ended": ended, "hosts": list(group.nodes),
                "stopped_by": by}  # fmt: skip
        note_path = parent / MEMBER_NOTE.format(index=group.instance)
        record_io.write_atomic(note_path, note, overwrite=True)
    if sampling is not None:
        window_energy.write_node(
            parent, sampling, _note_paths(parent, group.instances), ran_s, args.power_hz
        )
    if group.chief:
        _assemble(parent, setup, group, args)
    return code


def _note_paths(parent: Path, instances: int) -> list[Path]:
    return [parent / MEMBER_NOTE.format(index=i) for i in range(instances)]


def _claimed(parent: Path) -> bool:
    """Whether this chief is the one to write the throughput record: the first to create
    PARENT/.assembling (chiefs that waited for the nodes' energy find every note at once)."""
    try:
        os.close(os.open(parent / ".assembling", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _assemble(parent: Path, setup, group: plans.SlurmGroup, args) -> None:
    """The throughput record (an ensemble's where `args` say so), once every instance's
    member note is there (the last chief to end writes it and says its score; one that
    finds it written leaves it)."""
    notes = _note_paths(parent, group.instances)
    if not all(p.exists() for p in notes) or not _claimed(parent):
        return
    members = [record_io.parse_json(p.read_text(), p, "member note") for p in notes]
    data = _record(setup, group.instances, group.tasks_per_instance, members, "slurm", None)
    ensemble.mark(data, args)
    stopped = [m for m in members if m.get("stopped_by")]
    if stopped:  # a scancel (or srun's stop) reached these instances: one stop, not scored
        data["status"] = "stopped"
        data["warnings"].append(
            f"stopped by {stopped[0]['stopped_by']}: instance(s) "
            f"{', '.join(str(m['index']) for m in stopped)} of {group.instances}"
        )
    seen = [throughput.read_member(parent, m) for m in members]
    start, stop = throughput.member_window(seen)
    data["window"] = {"start": start, "stop": stop}
    hosts = [host for member in members for host in member["hosts"]]
    energy, more = (None, [])
    if args.power_hz and not args.meter_log:  # each node's own block, else the members
        energy, more = window_energy.nodes_energy(parent, hosts, start, stop)
    if energy is None:
        energy, fallback = window_energy.members_energy(seen, start, stop)
        more += fallback
    data["energy"] = energy
    data["warnings"] += more
    try:
        path = record_io.write_atomic(parent / throughput.FILE, data)
    except UserError:
        return  # another instance's chief wrote it as this one ended
    print(f"throughput record: {path}", flush=True)
    _say_score(path, data)
