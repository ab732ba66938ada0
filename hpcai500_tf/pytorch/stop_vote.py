"""The stop vote of a PyTorch run on several workers, carried by DDP's own gradient all-reduce
(run/stop.py says why).

A ballot: one zero-valued parameter per stop signal, beside the network inside the module DDP
wraps (`voting_model`). Each step adds `(ballot * vote).sum()` to the loss it differentiates: a
term of value zero, so the loss and every other gradient are unchanged bit for bit, whose
gradient is this worker's vote. DDP then averages the ballot's gradient with the network's in
its own all-reduce (in whichever bucket DDP gives it), so the vote costs no hook, no copy and
no collective of its own, and the workers' summed votes are ready when `backward()` returns.
The ballot is in no optimizer group (it never moves from zero) and in no checkpoint (the
trainer saves the network).
"""

from __future__ import annotations

from hpcai500_tf.run import stop


def voting_model(torch, network, device):
    """`network` with a ballot beside it (`.network`, `.ballot`): what DDP wraps on several
    workers; its forward pass is the network's."""

    class Voting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.network = network
            self.ballot = torch.nn.Parameter(
                torch.zeros(len(stop.STOP_SIGNALS), dtype=torch.float32, device=device)
            )

        def forward(self, images):
            return self.network(images)

    return Voting()


class Ballot:
    """The ballot's per-step term and the summed votes it brings back."""

    def __init__(self, torch, parameter, world_size: int):
        self.torch = torch
        self.parameter = parameter
        self.world_size = world_size
        self._votes = {}  # signum -> its vote as a tensor on the ballot's device

    def term(self, signum: int):
        """What the step adds to the loss it differentiates: zero, with this worker's vote for
        the ballot's gradient (the gradient left by the step before is dropped first)."""
        vote = self._votes.get(signum)
        if vote is None:
            torch, device = self.torch, self.parameter.device
            vote = torch.tensor(stop.vote(signum), dtype=torch.float32, device=device)
            self._votes[signum] = vote
        self.parameter.grad = None
        return (self.parameter * vote).sum()

    def summed(self):
        """The workers' summed votes of the last backward pass (a tensor on the device; DDP
        left their mean in the ballot's gradient)."""
        return self.parameter.grad.detach() * self.world_size
