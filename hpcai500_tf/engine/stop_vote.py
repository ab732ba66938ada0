"""The per-step stop vote of a TensorFlow run on several workers (run/stop.py says why).

Each step boundary every worker all-reduces its vote (`stop.vote`: a few floats) under the
strategy, and acts on the vote of the step before, whose all-reduce has long ended: on a GPU
the host never waits for the device for it, and every worker reads the same sums, so all stop
after the same step (at most two steps after the signal).
"""

from __future__ import annotations

import tensorflow as tf

from hpcai500_tf.run import stop


class StopVote:
    """`agree(local)`: the signal every worker agrees to stop for (0: none), one step late."""

    def __init__(self, strategy: tf.distribute.Strategy):
        self.strategy = strategy
        self.pending = None  # the last vote's sums, not yet read

        @tf.function(input_signature=[tf.TensorSpec([len(stop.STOP_SIGNALS)], tf.float32)])
        def all_reduce(votes):
            per_replica = strategy.run(lambda: tf.identity(votes))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        self._all_reduce = all_reduce

    def agree(self, local: int) -> int:
        previous, self.pending = self.pending, self._all_reduce(tf.constant(stop.vote(local)))
        return 0 if previous is None else stop.agreed(previous.numpy().tolist())
