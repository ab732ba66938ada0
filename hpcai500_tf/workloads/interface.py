"""What a workload gives the engine, the record and the roofline: the interface every module in
`workloads/` implements with its `WORKLOAD` class (found by name, `build_workload`). Pure
Python, so that the interface reads without TensorFlow; the types TensorFlow owns are `Any`."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Workload(Protocol):
    """One benchmark's model, data, loss and quality, from its resolved config and data."""

    name: str  # the benchmark's name, as configs/ names it
    quality_metric: str  # the record's quality.metric
    # The training loss, named for every framework: "softmax_cross_entropy" (label-smoothed
    # by optimizer.label_smoothing) or "faster_rcnn" (the detector's own losses).
    objective: str
    input_dtype: Any  # what every data source yields (a tf.DType); the engine checks it
    train_examples: int  # one epoch's examples, as the data holds them
    eval_examples: int
    kernels: str  # what the model runs on (models/kernels.py), as L7 records it

    def __init__(self, preset: dict, data_dir: str | None) -> None: ...

    @property
    def measures_quality(self) -> bool:
        """False where the data is random: a throughput-only run."""

    def input_shape(self) -> tuple[int, int, int]:
        """One example's shape (height, width, channels)."""

    def build_model(self) -> Any:
        """The Keras model, built under the caller's strategy scope."""

    def dataset(self, training: bool, seed: int, shard: tuple[int, int]) -> Any:
        """Unbatched (image, label) pairs of one split for worker `shard` = (count, index)."""

    def data_warnings(self, workers: int) -> list[str]:
        """What the record should say about this data on `workers` workers."""

    def per_example_loss(self, model: Any, images: Any, labels: Any, label_smoothing: float):
        """The loss of each example of one replica's batch (the model run in training mode)."""

    def empty_label(self) -> Any:
        """One example's label, for tracing and warm-up."""

    def eval_outputs(self, model: Any, images: Any, labels: Any) -> dict:
        """What `quality` needs of one evaluation batch."""

    def quality(self, batches: list[dict]) -> float:
        """The quality metric over every evaluation batch's outputs."""

    def workload_layer(self) -> dict:
        """L7: the model and what it runs on."""

    def dataset_name(self) -> str:
        """L9's dataset, in words."""

    def problem_layer(self) -> dict:
        """L9 facts verified from the data (empty for generated data)."""

    def analytical_forward_flops(self, model: Any) -> float | None:
        """Forward FLOPs per example by formula, beside the profiled count."""
