"""Workloads by name: each supplies model, data, loss and quality to the shared engine."""

from hpcai500_tf.errors import UserError


def build_workload(name: str, config: dict, data_dir: str | None):
    if name == "image_classification":
        from hpcai500_tf.workloads.image_classification import ImageClassification

        return ImageClassification(config, data_dir)
    if name == "extreme_weather":
        from hpcai500_tf.workloads.extreme_weather import ExtremeWeather

        return ExtremeWeather(config, data_dir)
    raise UserError(f"benchmark '{name}' has no training workload yet")
