"""Choosing the tf.distribute strategy. Build it before any other TF op runs.

Between workers the collective implementation is chosen here, not left to TensorFlow, whose
AUTO means ring all-reduce over gRPC between workers even on GPUs: `auto` is NCCL where
TensorFlow sees a GPU and ring otherwise, and the implementation used is recorded in L3.
"""

from __future__ import annotations

import tensorflow as tf

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
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        communication = communication or CommunicationConfig("auto", 0.0, 0.0)
        # The resolver first (under Slurm it narrows CUDA_VISIBLE_DEVICES), then the GPUs
        # TensorFlow sees, then the strategy, which waits for every worker.
        resolver, found = cluster.cluster_resolver()
        gpus = tf.config.list_physical_devices("GPU")
        collective = cluster.resolve_collective(communication.collective, gpus)
        # No timeout on the collectives themselves: TensorFlow then starts a timer thread per
        # collective op that lives for the whole timeout (tens of thousands of threads at a few
        # steps a second on 8 GPUs). A lost peer is found by the coordination service's
        # heartbeat instead, whose cost does not grow with steps.
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=_IMPLEMENTATIONS[collective]
        )
        if resolver is not None:
            watch_peers(resolver.cluster_spec(), communication.timeout_s)
        seconds = communication.join_timeout_s
        where = "" if resolver is None else f" ({found}: {resolver.cluster_spec().as_dict()})"
        message = (
            f"not every worker joined the cluster within {seconds:g} s{where}; "
            "check that all were started (communication.join_timeout_s)"
        )
        with cluster.JoinWatchdog(seconds if resolver is not None else 0, message):
            strategy = tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=resolver, communication_options=options
            )
        strategy.hpcai500_cluster_source = found
        strategy.hpcai500_cluster_warnings = list(getattr(resolver, "hpcai500_warnings", []))
        strategy.hpcai500_collective = collective
        strategy.hpcai500_collective_requested = communication.collective
        return strategy
    raise UserError(f"unknown strategy '{name}'")


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
    return facts, workers, index
