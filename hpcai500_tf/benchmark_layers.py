"""L6-L9 of a run (programming model, workload, hyperparameters, problem): set by its config
and its workload, in terms every framework's runner shares. L1-L3 are observed on the machine
(cluster/machine.py), L4-L5 read from the framework (backends.py).
"""

from __future__ import annotations

from hpcai500_tf.config import peak_learning_rate
from hpcai500_tf.models.kernel_choices import BATCH_NORM_KERNELS


def run_layers(
    setup,
    workload,
    *,
    workers: int,
    replicas: int,
    global_batch: int,
    precision: str,
    initial_loss_scale: float | None = None,
    intra_op_threads: int,
) -> dict[str, dict]:
    """L6-L9 of a run, in terms every framework's runner shares (`setup`: config.Setup;
    `workload`: a workload, or the PyTorch runner's facts of one). `initial_loss_scale`: where
    dynamic loss scaling ran (float16), the scale it started from; None where none ran. A
    float16 run configured for a fixed scale (`optimizer.loss_scaling = "fixed"`) records it
    as its initial scale."""
    t, o = setup.training, setup.optimizer
    if initial_loss_scale:
        loss_scaling = "dynamic"
    elif precision == "mixed_float16" and o.loss_scaling == "fixed":
        loss_scaling, initial_loss_scale = "fixed", o.loss_scale
    else:
        loss_scaling = "none"
    return {
        "L6": {
            "parallelism": "data_parallel",
            "synchronous": True,
            "strategy": t.strategy,
            "workers": workers,
            "replicas": replicas,
            "batch_per_replica": t.batch_per_replica,
            "global_batch": global_batch,
            "intra_op_threads": intra_op_threads,
        },
        "L7": {
            **workload.workload_layer(),
            "kernels": workload.kernels,  # what ran (models/kernels.py resolve), not "auto"
            "batch_norm": BATCH_NORM_KERNELS.get(workload.kernels),
            "precision": precision,
            "xla": t.xla,
        },
        "L8": {
            "optimizer": "sgd_momentum" if o.name == "sgd" else "lars",
            "momentum": o.momentum,
            "momentum_form": o.momentum_form,  # tf1 | keras (config.MOMENTUM_FORMS)
            "weight_decay": o.weight_decay,
            "decay_all_variables": o.decay_all_variables,
            "label_smoothing": o.label_smoothing,
            "lr_schedule": f"warmup_{o.schedule}",
            **({"cosine_start": o.cosine_start} if o.schedule == "cosine" else {}),
            "base_learning_rate": o.base_learning_rate,
            "peak_learning_rate": peak_learning_rate(o, global_batch),
            "warmup_epochs": o.warmup_epochs,
            # The precision policy is L7's `precision`; its loss scaling is the optimizer's.
            "loss_scaling": loss_scaling,  # dynamic | fixed | none
            "initial_loss_scale": initial_loss_scale,
            "seed": t.seed,
            **({"lars_eta": o.lars_eta} if o.name == "lars" else {}),
            **(
                {"step_boundaries": o.step_boundaries, "step_factor": o.step_factor}
                if o.schedule == "step"
                else {}
            ),
        },
        "L9": {
            "dataset": workload.dataset_name(),
            "quality_metric": workload.quality_metric,
            "target_quality": t.target_quality,
            "epochs": t.epochs,
            **workload.problem_layer(),  # what was verified from the data, if anything
        },
    }
