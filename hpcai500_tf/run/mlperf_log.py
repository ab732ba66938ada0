"""The MLPerf log's setup events, between init_start and init_stop: the same on every
framework."""

from __future__ import annotations

from hpcai500_tf.cluster import machine
from hpcai500_tf.config import Setup, peak_learning_rate
from hpcai500_tf.mlperf.mllog import MLLogger, mlperf_benchmark_name


def log_setup(mllog: MLLogger, setup: Setup, global_batch: int, workload) -> None:
    """The MLPerf setup events every runner logs between init_start and init_stop."""
    t, o = setup.training, setup.optimizer
    mllog.event("submission_benchmark", mlperf_benchmark_name(setup.benchmark.name))
    mllog.event("submission_division", "open")
    mllog.event("submission_org", "hpcai500-tf")
    mllog.event("submission_platform", machine.hardware_layer()["summary"])
    mllog.event("submission_status", "research")
    mllog.event("cache_clear", True)
    mllog.event("seed", t.seed)
    mllog.event("global_batch_size", global_batch)
    mllog.event("train_samples", workload.train_examples)
    mllog.event("eval_samples", workload.eval_examples)
    mllog.event("gradient_accumulation_steps", 1)
    mllog.event("opt_name", o.name)
    prefix = "sgd_opt" if o.name == "sgd" else "lars_opt"
    mllog.event(f"{prefix}_base_learning_rate", peak_learning_rate(o, global_batch))
    mllog.event(f"{prefix}_momentum", o.momentum)
    mllog.event(f"{prefix}_weight_decay", o.weight_decay)
    mllog.event("opt_learning_rate_warmup_epochs", o.warmup_epochs)
    mllog.event("opt_learning_rate_schedule", o.schedule)
    mllog.event("model_bn_span", t.batch_per_replica)
    mllog.event("label_smoothing", o.label_smoothing)
    if o.name == "lars":
        mllog.event("lars_epsilon", 0.0)
        mllog.event("lars_eta", o.lars_eta)
