"""Where a run stands in its data: epochs done, and batches done in the next one.

Each epoch's training data is its own stream, shuffled by `epoch_seed(seed, epoch)`, so that a
run stopped mid-epoch resumes at the next batch of that epoch with the data order an
uninterrupted run has: the resumed epoch's stream is built again with its seed and its first
`batches_done` batches skipped (read and dropped by the input pipeline, not trained on: at
most one epoch's reading), and every later epoch is as it would have been. No shuffle buffer
is saved. Pure Python: no framework is imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from hpcai500_tf.errors import UserError


def epoch_seed(seed: int, epoch: int) -> int:
    """The shuffle seed of epoch `epoch` (counted from 0) of a run seeded `seed`."""
    return seed + epoch


def epoch_batches(
    open_epoch: Callable[[int, int], Iterator],
    epochs_done: int,
    batches_done: int,
    epochs: int,
    steps_per_epoch: int,
) -> Iterator:
    """The run's training batches from its position on: `open_epoch(epoch, skip)` opens
    epoch `epoch`'s stream with its first `skip` batches dropped; `steps_per_epoch` batches
    are taken from each (a stream may repeat its data to fill them)."""
    for epoch in range(epochs_done, epochs):
        skip = batches_done if epoch == epochs_done else 0
        stream = open_epoch(epoch, skip)
        for _ in range(steps_per_epoch - skip):
            yield next(stream)


def held(position) -> tuple[int, int] | None:
    """(epochs, batches) of what a trainer's `read_checkpoint` returned: an epoch count
    (an epoch-end checkpoint), an (epochs, batches) pair, or None (it holds no count)."""
    if position is None:
        return None
    if isinstance(position, int):
        return position, 0
    epochs, batches = position
    return int(epochs), int(batches)


def check_held(position, state: dict, prefix) -> None:
    """Refuse a checkpoint whose own position is not the one state.json names."""
    found = held(position)
    said = (state["epochs_done"], state.get("batches_done", 0))
    if found is not None and found != said:
        raise UserError(
            f"{prefix}: holds {_words(*found)}, but the resume state says {_words(*said)} "
            "were done: resume refused"
        )


def _words(epochs: int, batches: int) -> str:
    return f"{epochs} epoch(s)" + (f" and {batches} batch(es)" if batches else "")
