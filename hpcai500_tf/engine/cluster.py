"""TensorFlow's side of a multi-worker run: its cluster resolver (from the cluster that
cluster/workers.py finds and checks), the collectives that compare workers, and the end of a
worker that must not wait for a lost peer.
"""

from __future__ import annotations

import os
import sys

from hpcai500_tf.cluster import workers
from hpcai500_tf.cluster.slurm import check_port_free


def cluster_resolver():
    """(resolver or None, how the cluster was found). TF_CONFIG first, then Slurm, whose task
    is kept to its share of the GPUs (`workers.slurm_gpu_variables`, set in os.environ for
    `strategy.restrict_to_worker_gpus`, CUDA and the energy count); its CPU warning, if any,
    is the resolver's `hpcai500_warnings`."""
    import tensorflow as tf

    text = os.environ.get("TF_CONFIG")
    if text:
        config = workers.parse_tf_config(text)
        check_port_free(workers.own_address(config))
        return tf.distribute.cluster_resolver.TFConfigClusterResolver(), "TF_CONFIG"
    if not workers.under_slurm():
        return None, workers.SINGLE_WORKER
    node_gpus = workers.gpus_on_node(os.environ)
    visible = workers.visible_gpus(os.environ, node_gpus)
    task = workers.slurm_cluster(os.environ, node_gpus)
    task.check_port()
    os.environ.update(workers.slurm_gpu_variables(os.environ, task, visible))
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": list(task.addresses)}),
        task_type="worker",
        task_id=task.index,
        rpc_layer="grpc",
        # MultiWorkerMirroredStrategy runs one replica per GPU counted here (CPU where none):
        # the task's own, however they are kept to it
        num_accelerators={"GPU": len(task.gpus)} if task.gpus else None,
    )
    resolver.hpcai500_warnings = [task.warning] if task.warning else []
    resolver.hpcai500_gpus = len(task.gpus)  # Slurm's grant: `strategy.check_gpus_seen`
    return resolver, "Slurm"


def same_on_all_workers(strategy, fingerprint: str) -> bool:
    """Whether every worker holds this fingerprint (a hex string): gathered collectively."""
    import tensorflow as tf

    value = int(fingerprint[:15], 16)  # 60 bits, as three float32-exact 20-bit pieces
    local = tf.constant([[(value >> (20 * i)) & 0xFFFFF for i in range(3)]], tf.float32)
    return bool((_all_gather(strategy, local) == local.numpy()).all())


def gather_rows(strategy, row: list[float]):
    """Every worker's `row` (float64), ordered by worker: (workers, len(row)) numpy array.
    With several replicas per worker, each worker's first replica is kept."""
    import tensorflow as tf

    rows = _all_gather(strategy, tf.constant([row], tf.float64))
    per_worker = len(rows) // max(1, strategy.extended._num_workers)  # replicas per worker
    return rows[::per_worker]


def _all_gather(strategy, local):
    """Every replica's `local` (one row each), stacked in replica order: a numpy array."""
    import tensorflow as tf

    @tf.function
    def gather():
        def replica():
            return tf.distribute.get_replica_context().all_gather(local, axis=0)

        return strategy.experimental_local_results(strategy.run(replica))[0]

    return gather().numpy()


def exit_without_shutdown(code: int) -> None:
    """End a worker of a failed multi-worker run now: TensorFlow's orderly shutdown would wait
    for the lost peer forever. Output is flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
