"""The stop vote of a PyTorch run on several workers, carried by DDP's own gradient all-reduce
(run/stop.py says why).

`carry_votes(torch, ddp_model)` registers a communication hook that averages every gradient
bucket as DDP does by default (each divided by the world size, then summed) and, on the first
bucket of each backward pass, appends this worker's vote to it: the sums come back with the
gradients, so the vote costs no collective of its own. The hook's futures have all ended when
`backward()` returns, so the step's summed votes are ready to keep (`PendingVotes.push`).
"""

from __future__ import annotations

from hpcai500_tf.run import stop


class CarriedVote:
    """The hook's state: the vote the next backward pass carries, and the sums it brought."""

    def __init__(self, torch, world_size: int):
        self.torch = torch
        self.world_size = world_size
        self.local = None  # this worker's vote (a tensor on the bucket's device), or None
        self.summed = None  # the sums of the last backward pass that carried a vote

    def hook(self, state, bucket):
        torch, world_size = self.torch, self.world_size
        buffer = bucket.buffer()
        if bucket.index() != 0 or self.local is None:  # DDP's default: the workers' mean
            buffer.div_(world_size)
            work = torch.distributed.all_reduce(buffer, async_op=True)
            return work.get_future().then(lambda future: future.value()[0])
        size, local, self.local = buffer.numel(), self.local, None
        flat = torch.cat([buffer / world_size, local.to(buffer.dtype)])
        work = torch.distributed.all_reduce(flat, async_op=True)

        def split(future):
            summed = future.value()[0]
            self.summed = summed[size:].clone()
            return summed[:size]

        return work.get_future().then(split)


def carry_votes(torch, model, world_size: int) -> CarriedVote:
    """Register the vote-carrying hook on the DDP `model`; its state, to set `local` on."""
    carried = CarriedVote(torch, world_size)
    model.register_comm_hook(None, carried.hook)
    return carried


def vote_tensor(torch, signum: int, device):
    """This worker's vote (`stop.vote`) as a float tensor on `device`."""
    return torch.tensor(stop.vote(signum), dtype=torch.float32, device=device)
