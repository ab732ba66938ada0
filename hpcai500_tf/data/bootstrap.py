"""The bootstrap sample an ensemble member trains on: N draws with replacement from the N
examples of the training split, seeded by the run's seed and the member's index.

The draw is made once, when the workload is built, and is the member's training data for
every epoch (procedural examples by their number; ImageNet TFRecords by each record's place
in the verified shard listing, data/bootstrap_records.py): each epoch's stream shuffles
within it (its own seeded order, run/data_position.py), so a member stopped mid-epoch and
resumed rebuilds the same sample from its saved config and continues the same stream. Its
method, seed and a digest of the drawn indices go into the member's record (L9
`training_sample`), so a reader can draw it again and check it. Pure numpy: no framework is
imported here.
"""

from __future__ import annotations

import hashlib

import numpy as np

METHOD = (
    "numpy.random.default_rng(numpy.random.SeedSequence([seed, member])).integers(0, N, "
    "size=N): N draws with replacement from training examples 0 .. N - 1"
)
DIGEST_METHOD = "sha256 of the drawn indices as little-endian int64, in draw order"


def draw(seed: int, member: int, examples: int) -> np.ndarray:
    """Member `member`'s bootstrap sample of `examples` training examples: their indices,
    in draw order (int64), the same for the same (seed, member, examples)."""
    generator = np.random.default_rng(np.random.SeedSequence([seed, member]))
    return generator.integers(0, examples, size=examples, dtype=np.int64)


def digest(indices: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(indices, dtype="<i8").tobytes()).hexdigest()


def description(seed: int, member: int, indices: np.ndarray, index: str | None = None) -> dict:
    """What the record says of a draw: enough to draw it again and check it; `index`: which
    example an index names, where it is not the example's own number (TFRecords')."""
    said = {
        "method": METHOD,
        "seed": [int(seed), int(member)],
        "member": int(member),
        "draws": int(indices.size),
        "distinct_examples": int(np.unique(indices).size),
        "digest": digest(indices),
        "digest_method": DIGEST_METHOD,
    }
    return {**said, "index": index} if index else said


def member_sample(
    seed: int, member: int, examples: int, facts: dict, index: str | None = None
) -> np.ndarray | None:
    """What a workload trains on as member `member` of an ensemble (-1: none): its draw of
    `examples` training examples, described in `facts["training_sample"]` (its L9 facts;
    `index` as in `description`); None, and nothing described, outside an ensemble."""
    if member < 0:
        return None
    indices = draw(seed, member, examples)
    facts["training_sample"] = description(seed, member, indices, index)
    return indices
