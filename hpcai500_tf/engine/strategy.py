"""Choosing the tf.distribute strategy. Build it before any other TF op runs.

Between workers the collective implementation is chosen here, not left to TensorFlow, whose
AUTO means ring all-reduce over gRPC between workers even on GPUs: `auto` is NCCL where
TensorFlow sees a GPU and ring otherwise, and the implementation used is recorded in L3.

A worker of `--workers N` sees every GPU CUDA makes visible and gets its share of them in
HPCAI500_WORKER_GPUS (positions in that list): TensorFlow is restricted to the share by
tf.config.set_visible_devices before its GPU runtime starts, so CUDA (and NCCL) still see the
peers' GPUs. L3's `gpu_assignment` says how worker 0's GPUs were chosen.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import tensorflow as tf

from hpcai500_tf.cluster import workers as cluster_workers
from hpcai500_tf.cluster.devices import WORKER_GPUS, cuda_visible_entries, worker_gpu_positions
from hpcai500_tf.config import CommunicationConfig
from hpcai500_tf.engine import cluster
from hpcai500_tf.errors import UserError

_IMPLEMENTATIONS = {
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def make_strategy(
    name: str, communication: CommunicationConfig | None = None
) -> tf.distribute.Strategy:
    if name == "default":
        first_gpu_only(os.environ, len(tf.config.list_physical_devices("GPU")))
        restrict_to_worker_gpus()
        return tf.distribute.get_strategy()
    if name == "mirrored":
        restrict_to_worker_gpus()
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        communication = communication or CommunicationConfig("auto", 0.0, 0.0)
        # The resolver first (under Slurm it sets this task's share of the GPUs its node's
        # tasks share), then this worker's share of the GPUs, then the GPUs TensorFlow computes
        # on, then the strategy, which waits for every worker.
        resolver, found = cluster.cluster_resolver()
        assignment = restrict_to_worker_gpus()
        gpus = tf.config.get_visible_devices("GPU")
        check_gpus_seen(resolver, found, gpus)
        collective = cluster_workers.resolve_collective(communication.collective, gpus)
        # No timeout on the collectives themselves: TensorFlow then starts a timer thread per
        # collective op that lives for the whole timeout (tens of thousands of threads at a few
        # steps a second on 8 GPUs). A lost peer is found by the coordination service's
        # heartbeat instead, whose cost does not grow with steps.
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=_IMPLEMENTATIONS[collective]
        )
        if resolver is not None:
            cluster_workers.check_hosts_resolve(resolver.cluster_spec().as_dict(), found)
            watch_peers(resolver.cluster_spec(), communication.timeout_s)
        seconds = communication.join_timeout_s
        where = "" if resolver is None else f" ({found}: {resolver.cluster_spec().as_dict()})"
        message = (
            f"not every worker joined the cluster within {seconds:g} s{where}; "
            "check that all were started (communication.join_timeout_s)"
        )
        with cluster_workers.JoinWatchdog(seconds if resolver is not None else 0, message):
            strategy = tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=resolver, communication_options=options
            )
        strategy.hpcai500_cluster_source = found
        strategy.hpcai500_cluster_warnings = list(getattr(resolver, "hpcai500_warnings", []))
        strategy.hpcai500_collective = collective
        strategy.hpcai500_collective_requested = communication.collective
        strategy.hpcai500_gpu_assignment = assignment
        return strategy
    raise UserError(f"unknown strategy '{name}'")


def check_gpus_seen(resolver, found: str, gpus: list) -> None:
    """Refuse, in one line, a task whose cluster counts more GPUs for it (Slurm's grant) than
    TensorFlow sees: its strategy would wait at the first step for GPU replicas that never
    come. None seen: a CPU-only TensorFlow, such as tensorflow-cpu, in a GPU job; fewer: MIG
    instances, of which CUDA shows a process only the first however many are visible."""
    # As the resolver counted them (never `num_accelerators()`: TF_CONFIG's resolver starts
    # TensorFlow's runtime to answer it, before the strategy can configure its collectives)
    counted = getattr(resolver, "hpcai500_gpus", 0)
    if len(gpus) >= counted:
        return
    if gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        raise UserError(
            f"{found} gave this task {counted} GPUs, but TensorFlow sees {len(gpus)}"
            + (
                f" (CUDA_VISIBLE_DEVICES={visible!r}: CUDA shows a process one MIG instance, "
                "however many are visible); give each task one MIG instance "
                "(--gpus-per-task=1) or whole GPUs"
                if any(entry.startswith("MIG-") for entry in cuda_visible_entries(visible))
                else "; check CUDA_VISIBLE_DEVICES and the driver"
            )
        )
    why = (
        "this TensorFlow is built without CUDA (e.g. tensorflow-cpu)"
        if not tf.test.is_built_with_cuda()
        else "CUDA finds no GPU (check the driver and CUDA_VISIBLE_DEVICES)"
    )
    raise UserError(
        f"{found} gave this task {counted} GPU(s), but TensorFlow sees none: {why}; install a "
        "TensorFlow with GPU support (pip install 'tensorflow[and-cuda]'), or run the job "
        "without GPUs to train on the CPUs"
    )


def first_gpu_only(environ, gpu_count: int) -> None:
    """The default strategy computes on one GPU, the first of this worker's (its share, or
    those CUDA makes visible): make that GPU the share, so that TensorFlow holds no other's
    memory and L1 and the energy count it alone. A share that does not fit is left for
    `restrict_to_worker_gpus` to refuse."""
    if gpu_count < 2:
        return
    share = environ.get(WORKER_GPUS)
    if share is None:
        environ[WORKER_GPUS] = "0"
        return
    positions, _ = worker_gpu_positions(share, gpu_count)
    if positions and len(positions) > 1:
        environ[WORKER_GPUS] = str(positions[0])


def restrict_to_worker_gpus(environ: Mapping[str, str] | None = None) -> str | None:
    """Restrict TensorFlow to this worker's share of the GPUs (WORKER_GPUS, positions in the
    list CUDA makes visible, set by `--workers N` or, for Slurm tasks sharing a node's GPUs,
    by `cluster.cluster_resolver`) with tf.config.set_visible_devices, leaving every GPU
    visible to CUDA; call before TensorFlow's GPU runtime starts. Returns how this process's
    GPUs were chosen, for L3 (None where TensorFlow sees no GPU: `check_devices` says why). A
    share that does not fit, or one set once the runtime has started, is a one-line
    UserError."""
    environ = os.environ if environ is None else environ
    share = environ.get(WORKER_GPUS)
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    if share is None:
        count = f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''}"
        return f"CUDA_VISIBLE_DEVICES: the {count} CUDA makes visible to this process"
    positions, problem = worker_gpu_positions(share, len(gpus))
    if positions is None:
        raise UserError(f"{problem} (TensorFlow sees {len(gpus)})")
    try:
        tf.config.set_visible_devices([gpus[position] for position in positions], "GPU")
    except RuntimeError:
        raise UserError(
            f"{WORKER_GPUS}={share!r}: TensorFlow's GPU runtime had already started, so this "
            "worker cannot be restricted to its GPUs (tf.config.set_visible_devices must run "
            "before any op)"
        ) from None
    return (
        f"tf.config.set_visible_devices: GPUs {','.join(map(str, positions))} of the "
        f"{len(gpus)} CUDA makes visible to every worker ({WORKER_GPUS})"
    )


def watch_peers(cluster_spec: tf.train.ClusterSpec, timeout_s: float) -> None:
    """Configure TensorFlow's coordination service (which MultiWorkerMirroredStrategy would
    otherwise set up with its defaults) so that a worker that stops answering its heartbeat
    for `timeout_s` (0: TensorFlow's default, 10 s) aborts every worker's collectives: the run
    then ends as `stopped`, resumable. A dead process is usually found sooner, when its
    connections close."""
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    jobs = [
        coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
        for job in ("chief", "worker")
        if job in cluster_spec.jobs
    ]
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster_spec),
        heartbeat_timeout_in_ms=int(timeout_s * 1000),
        coordinated_jobs=jobs,
    )


def describe(strategy: tf.distribute.Strategy, name: str) -> tuple[dict, int, int]:
    """(L3 communication facts, number of workers, this worker's index)."""
    workers, index, collective, source, requested, addresses = 1, 0, None, None, None, None
    resolver = getattr(strategy, "cluster_resolver", None)
    if name == "multi_worker" and resolver is not None:
        spec = resolver.cluster_spec().as_dict()
        addresses = [*spec.get("chief", []), *spec.get("worker", [])]  # rank order
        workers = max(1, len(spec.get("worker", [])) + len(spec.get("chief", [])))
        index = (resolver.task_id or 0) + (
            len(spec.get("chief", [])) if resolver.task_type == "worker" else 0
        )
        implementation = getattr(strategy, "hpcai500_collective", "auto").upper()
        collective = f"tf.distribute collective ops (CommunicationImplementation.{implementation})"
        source = getattr(strategy, "hpcai500_cluster_source", None)
        requested = getattr(strategy, "hpcai500_collective_requested", None)
    elif name == "mirrored":
        collective = type(getattr(strategy.extended, "_cross_device_ops", None)).__name__
    facts = {
        "collective_implementation": collective,
        "note": None if collective else "single device: no collectives",
    }
    if requested:
        facts["collective_requested"] = requested  # communication.collective, e.g. auto
    if source:
        facts["cluster_from"] = source
    if addresses:  # the hosts the workers ran on, each once, in rank order (no ports)
        facts["nodes"] = list(dict.fromkeys(a.rpartition(":")[0] for a in addresses))
    assignment = getattr(strategy, "hpcai500_gpu_assignment", None)
    if assignment:  # worker 0's: every worker's share is as large, at its own positions
        facts["gpu_assignment"] = assignment
    return facts, workers, index
