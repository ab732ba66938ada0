"""Workloads by name: the module of that name here supplies model, data, loss and quality to
the shared engine (its `WORKLOAD` class, a `Workload` of `interface`), so that a new benchmark
is a module and a TOML file."""

import importlib

from hpcai500_tf.errors import UserError
from hpcai500_tf.workloads.interface import Workload


def build_workload(name: str, config: dict, data_dir: str | None) -> Workload:
    module = None
    if name.isidentifier():
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise  # a module the workload needs is missing: not an unknown benchmark
    if getattr(module, "WORKLOAD", None) is None:
        raise UserError(f"benchmark '{name}' has no training workload yet")
    return module.WORKLOAD(config, data_dir)
