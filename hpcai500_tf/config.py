"""Loading and validating the TOML configs: benchmarks, their presets, and level rules."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcai500_tf.errors import UserError

CONFIG_DIR = Path(__file__).parent / "configs"
LAYER_IDS = ("L1", "L2", "L3", "L4", "L5", "L6", "L7", "L8", "L9")


@dataclass(frozen=True)
class Benchmark:
    """The fixed problem of one benchmark (L9) and how its quality is scored."""

    name: str
    title: str
    quality_metric: str
    target_quality: float
    penalty_exponent: float
    penalty_exponent_grade: str
    epochs: int
    dataset: str
    reference_layers: dict[str, dict[str, Any]] = field(default_factory=dict)
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)

    def problem(self) -> dict[str, Any]:
        """The L9 layer every rankable record of this benchmark must carry."""
        return {
            "dataset": self.dataset,
            "quality_metric": self.quality_metric,
            "target_quality": self.target_quality,
            "epochs": self.epochs,
        }


@dataclass(frozen=True)
class Level:
    name: str
    description: str
    may_differ: tuple[str, ...]
    grade: str


@dataclass(frozen=True)
class Repeatability:
    olympic_min_runs: int
    max_cv: float


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise UserError(f"{path}: config file not found") from None
    except tomllib.TOMLDecodeError as error:
        raise UserError(f"{path}: not valid TOML ({error})") from None


def _require(table: dict, key: str, kind: type | tuple, path: Path, where: str) -> Any:
    if key not in table:
        raise UserError(f"{path}: missing key '{where}.{key}'")
    value = table[key]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise UserError(f"{path}: '{where}.{key}' must be {name}, got {value!r}")
    return value


def benchmark_names() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml") if p.stem != "levels")


def load_benchmark(name: str, config_dir: Path = CONFIG_DIR) -> Benchmark:
    """Load `configs/NAME.toml`; unknown names and malformed files raise UserError."""
    path = config_dir / f"{name}.toml"
    if name == "levels" or not path.is_file():
        known = ", ".join(benchmark_names())
        raise UserError(f"unknown benchmark '{name}' (known: {known})")
    data = _read_toml(path)
    table = _require(data, "benchmark", dict, path, "")
    target = float(_require(table, "target_quality", (int, float), path, "benchmark"))
    if not 0 < target <= 1:
        raise UserError(f"{path}: 'benchmark.target_quality' must be in (0, 1], got {target}")
    exponent = float(_require(table, "penalty_exponent", (int, float), path, "benchmark"))
    if exponent < 0:
        raise UserError(f"{path}: 'benchmark.penalty_exponent' must be >= 0, got {exponent}")
    epochs = _require(table, "epochs", int, path, "benchmark")
    if epochs <= 0:
        raise UserError(f"{path}: 'benchmark.epochs' must be a positive integer, got {epochs}")
    reference = data.get("reference_layers", {})
    for layer in reference:
        if layer not in LAYER_IDS:
            raise UserError(f"{path}: 'reference_layers.{layer}' is not a layer ({LAYER_IDS})")
    return Benchmark(
        name=_require(table, "name", str, path, "benchmark"),
        title=_require(table, "title", str, path, "benchmark"),
        quality_metric=_require(table, "quality_metric", str, path, "benchmark"),
        target_quality=target,
        penalty_exponent=exponent,
        penalty_exponent_grade=_require(table, "penalty_exponent_grade", str, path, "benchmark"),
        epochs=epochs,
        dataset=_require(table, "dataset", str, path, "benchmark"),
        reference_layers=reference,
        presets=data.get("presets", {}),
    )


def load_levels(config_dir: Path = CONFIG_DIR) -> tuple[dict[str, Level], Repeatability]:
    path = config_dir / "levels.toml"
    data = _read_toml(path)
    levels = {}
    for name, table in data.items():
        if name == "repeatability":
            continue
        may_differ = _require(table, "may_differ", list, path, name)
        for layer in may_differ:
            if layer not in LAYER_IDS or layer == "L9":
                raise UserError(f"{path}: '{name}.may_differ' has '{layer}' (L1-L8 allowed)")
        levels[name] = Level(
            name=name,
            description=_require(table, "description", str, path, name),
            may_differ=tuple(may_differ),
            grade=_require(table, "grade", str, path, name),
        )
    rep = _require(data, "repeatability", dict, path, "")
    repeatability = Repeatability(
        olympic_min_runs=_require(rep, "olympic_min_runs", int, path, "repeatability"),
        max_cv=float(_require(rep, "max_cv", (int, float), path, "repeatability")),
    )
    return levels, repeatability


def load_level(name: str, config_dir: Path = CONFIG_DIR) -> Level:
    levels, _ = load_levels(config_dir)
    if name not in levels:
        raise UserError(f"unknown level '{name}' (known: {', '.join(levels)})")
    return levels[name]
