"""The per-step stop vote of a PyTorch run on several workers (run/stop.py says why).

Each step boundary every worker starts an all-reduce of its vote (`stop.vote`: a few floats)
without waiting for it, and acts on the vote of the step before, which has ended by then: the
all-reduce overlaps the step, and every worker reads the same sums, so all stop after the
same step (at most two steps after the signal).
"""

from __future__ import annotations

from hpcai500_tf.run import stop


class StopVote:
    """`agree(local)`: the signal every worker agrees to stop for (0: none), one step late."""

    def __init__(self, torch):
        nccl = torch.distributed.get_backend() == "nccl"  # its tensors on the GPU; gloo's not
        self.torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu"
        self.pending = None  # (the all-reduce's work, its tensor), not yet read

    def agree(self, local: int) -> int:
        torch = self.torch
        votes = torch.tensor(stop.vote(local), dtype=torch.float32, device=self.device)
        work = torch.distributed.all_reduce(votes, async_op=True)
        previous, self.pending = self.pending, (work, votes)
        return 0 if previous is None else self._read(previous)

    def _read(self, pending) -> int:
        work, votes = pending
        work.wait()
        return stop.agreed(votes.cpu().tolist())

    def drain(self) -> None:
        """Wait for the last vote (every worker started it): nothing left in flight."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending[0].wait()
