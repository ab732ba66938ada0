"""Loading and validating the TOML configs: benchmarks, their presets, and level rules."""

from __future__ import annotations

import copy
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcai500_tf import record as record_io
from hpcai500_tf import validation, workload_config
from hpcai500_tf.errors import UserError
from hpcai500_tf.files import read_regular_file
from hpcai500_tf.layers import LAYER_IDS
from hpcai500_tf.validation import INT32_MAX, choice_problem, out_of_range, section


def _shipped_configs() -> Path:
    """The presets and level rules: the checkout's top-level configs/ (a clone, or an editable
    install of one), else the copy a wheel installs as hpcai500_tf/configs."""
    checkout = Path(__file__).resolve().parents[1] / "configs"
    if (checkout / "levels.toml").is_file():
        return checkout
    return Path(__file__).resolve().parent / "configs"


CONFIG_DIR = _shipped_configs()


@dataclass(frozen=True)
class Convention:
    """How a score is read: the quality exponent and the FLOP count. "stated" is the rule as
    published; another names what a published table's figures imply (see docs/scoring.md)."""

    name: str
    description: str
    penalty_exponent: float
    grade: str
    flop_basis: str | None = None  # None: the record's own count
    flops_per_example: float | None = None  # training FLOPs per example on that basis


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
    conventions: dict[str, Convention] = field(default_factory=dict)

    def convention(self, name: str = "stated") -> Convention:
        if name not in self.conventions:
            raise UserError(
                f"unknown scoring convention '{name}' for {self.name} "
                f"(known: {', '.join(self.conventions)})"
            )
        return self.conventions[name]

    def problem(self) -> dict[str, Any]:
        """The L9 layer every rankable record of this benchmark must carry."""
        return {
            "dataset": self.dataset,
            "quality_metric": self.quality_metric,
            "target_quality": self.target_quality,
            "epochs": self.epochs,
        }


def reference_allows(pin: Any, value: Any) -> bool:
    """Whether a record's layer value meets a `reference_layers` pin: the value itself, or
    `{ one_of = [...] }`, any of those."""
    if isinstance(pin, dict):
        return value in pin["one_of"]
    return value == pin


def reference_text(pin: Any) -> str:
    """A pin as the level rules name it: 'x', or one of 'x', 'y'."""
    if isinstance(pin, dict):
        return "one of " + ", ".join(repr(v) for v in pin["one_of"])
    return repr(pin)


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
    min_runs: int = 5
    max_runs_missing_target: int = 1


MAX_CONFIG_BYTES = 1 << 20  # a config file is a few KiB


def _read_toml(path: Path) -> dict[str, Any]:
    """A TOML file through the one regular-file reader (kind, size, UTF-8 checked first), parsed
    with one line for what tomllib cannot take (runaway nesting, integers of thousands of
    digits)."""
    text = read_regular_file(path, "config file", MAX_CONFIG_BYTES)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise UserError(f"{path}: not valid TOML ({error})") from None
    except RecursionError:
        raise UserError(f"{path}: not a config: nested too deeply") from None
    except ValueError as error:  # e.g. an integer past Python's 4300-digit limit
        raise UserError(f"{path}: not a config ({error})") from None


_KIND_WORDS = {str: "a string", int: "an integer", (int, float): "a number", dict: "a table"}
_KIND_WORDS |= {list: "a list", bool: "true or false"}


def _require(table: dict, key: str, kind: type | tuple, path: Path, where: str) -> Any:
    """`table[key]` of the given Python type, or the one-line error every input gets."""
    name = validation.dotted(where, key)
    if key not in table:
        raise validation.missing_key(path, name)
    value = table[key]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise validation.invalid(path, name, _KIND_WORDS[kind], value)
    return value


def benchmark_names() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml") if p.stem != "levels")


def load_benchmark(name: str, config_dir: Path = CONFIG_DIR) -> Benchmark:
    """Load `configs/NAME.toml`; unknown names and malformed files raise UserError."""
    path = config_dir / f"{name}.toml"
    if name == "levels" or name not in {p.stem for p in config_dir.glob("*.toml")}:
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
    for layer, pins in reference.items():
        if layer not in LAYER_IDS:
            raise UserError(f"{path}: 'reference_layers.{layer}' is not a layer ({LAYER_IDS})")
        for key, pin in pins.items() if isinstance(pins, dict) else ():
            one_of = isinstance(pin, dict) and list(pin) == ["one_of"]
            if isinstance(pin, dict) and not (one_of and isinstance(pin["one_of"], list)):
                raise UserError(
                    f"{path}: 'reference_layers.{layer}.{key}' must be a value or "
                    "{ one_of = [VALUES] }"
                )
    conventions = {
        "stated": Convention(
            "stated",
            "the rule as published: the record's own FLOP count, the stated exponent",
            exponent,
            _require(table, "penalty_exponent_grade", str, path, "benchmark"),
        )
    }
    table_of = data.get("conventions", {})
    if not isinstance(table_of, dict):
        raise UserError(f"{path}: 'conventions' must be a table")
    for key, entry in table_of.items():
        where = f"conventions.{key}"
        if not isinstance(entry, dict):
            raise UserError(f"{path}: '{where}' must be a table")
        value = float(_require(entry, "penalty_exponent", (int, float), path, where))
        per_example = entry.get("flops_per_example")
        if per_example is not None and (
            isinstance(per_example, bool) or not isinstance(per_example, int | float)
            or not 0 < per_example < 1e15
        ):  # fmt: skip
            raise UserError(f"{path}: '{where}.flops_per_example' must be a positive number")
        if not 0 <= value <= 100:
            raise UserError(f"{path}: '{where}.penalty_exponent' must be in [0, 100]")
        conventions[key] = Convention(
            key,
            _require(entry, "description", str, path, where),
            value,
            _require(entry, "grade", str, path, where),
            entry.get("flop_basis"),
            None if per_example is None else float(per_example),
        )
    return Benchmark(
        conventions=conventions,
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
        min_runs=_require(rep, "min_runs", int, path, "repeatability"),
        max_runs_missing_target=_require(
            rep, "max_runs_missing_target", int, path, "repeatability"
        ),
    )
    return levels, repeatability


def load_level(name: str, config_dir: Path = CONFIG_DIR) -> Level:
    levels, _ = load_levels(config_dir)
    if name not in levels:
        raise UserError(f"unknown level '{name}' (known: {', '.join(levels)})")
    return levels[name]


# ---------------------------------------------------------------- presets and run configs


def _deep_merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise UserError(f"--set '{text}': expected SECTION.KEY=VALUE")
    dotted, raw = text.split("=", 1)
    keys = dotted.strip().split(".")
    if len(keys) != 2 or not all(keys):
        raise UserError(f"--set '{text}': the key must be SECTION.KEY, e.g. training.epochs")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # a bare word is a string
    except RecursionError:
        raise UserError(f"--set {dotted.strip()}: the value is nested too deeply") from None
    except ValueError as error:  # e.g. an integer past Python's 4300-digit limit
        raise UserError(f"--set {dotted.strip()}: not a value this tool takes ({error})") from None
    return keys, value


def resolve_preset(benchmark: Benchmark, preset: str, overrides: list[str] = ()) -> dict:
    """The preset's table with its `inherits` chain merged in and `--set` overrides applied."""
    if preset not in benchmark.presets:
        known = ", ".join(benchmark.presets) or "none"
        raise UserError(f"unknown preset '{preset}' for {benchmark.name} (known: {known})")
    chain, name = [], preset
    while name is not None:
        if name in chain:
            raise UserError(f"preset '{preset}': 'inherits' forms a loop ({' -> '.join(chain)})")
        if name not in benchmark.presets:
            raise UserError(f"preset '{chain[-1]}' inherits unknown preset '{name}'")
        chain.append(name)
        name = benchmark.presets[name].get("inherits")
    resolved: dict = {}
    for name in reversed(chain):
        resolved = _deep_merge(resolved, benchmark.presets[name])
    resolved.pop("inherits", None)
    return _apply_tables(resolved, _override_tables(overrides), "--set")


def check_numbers(config: dict) -> None:
    """Every number in every section of a run config finite and every integer within
    [-INT32_MAX, INT32_MAX]: checked before TensorFlow starts, whatever the section (each
    section's `check()` states its own ranges)."""
    for name, table in config.items():
        for key, value in table.items() if isinstance(table, dict) else ():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, float) and not math.isfinite(item):
                    raise UserError(f"config: '{name}.{key}' must be a finite number, got {item}")
                if isinstance(item, int) and abs(item) > INT32_MAX:
                    raise UserError(
                        f"config: '{name}.{key}' must be within +-{INT32_MAX}, got {item}"
                    )


@dataclass(frozen=True)
class TrainingConfig:
    """Engine settings: how the run is distributed, timed, evaluated and checkpointed."""

    epochs: int
    target_quality: float
    batch_per_replica: int
    precision: str  # fp32 | mixed (mixed_float16 on GPU, mixed_bfloat16 on CPU) | fp16 | bf16
    xla: bool
    strategy: str  # default | mirrored | multi_worker
    eval_every: int
    checkpoint_every: int  # epochs between checkpoints (0: none by epoch count)
    seed: int
    deterministic: bool
    # Minutes of wall time after which an epoch's end writes a checkpoint (0: none by time);
    # one is written after the last epoch whatever both say. A default: configs saved before
    # this key (run directories, records) still load.
    checkpoint_minutes: float = 10.0

    def check(self) -> str | None:
        problem = out_of_range(
            self,
            epochs=(1, 10_000),
            batch_per_replica=(1, 1_048_576),
            eval_every=(1, 10_000),
            checkpoint_every=(0, 10_000),
            checkpoint_minutes=(0, 10_080),
            seed=(0, INT32_MAX),
        )
        if problem:
            return problem
        # below 0.001, (quality / target)^n overflows: the run could never be scored
        if not 1e-3 <= self.target_quality <= 1:
            return f"target_quality must be in [0.001, 1], got {self.target_quality}"
        if self.precision not in ("fp32", "mixed", "fp16", "bf16"):
            return f"precision must be fp32, mixed, fp16 or bf16, got '{self.precision}'"
        if self.strategy not in ("default", "mirrored", "multi_worker"):
            return f"strategy must be default, mirrored or multi_worker, got '{self.strategy}'"
        if self.deterministic and self.xla:
            return (
                "deterministic and xla cannot be combined (XLA has no deterministic "
                "max-pool gradient)"
            )
        return None


# The choices of the recipe's forms, each with what it means (docs/image_classification.md).
COSINE_STARTS = {
    "step_0": "cosine over all steps from step 0, warm-up overriding its start (the reference)",
    "warmup_end": "cosine over the steps after warm-up",
}
MOMENTUM_FORMS = {
    "tf1": "accum = momentum x accum + grad; var -= lr x accum (TF1 MomentumOptimizer)",
    "keras": "v = momentum x v - lr x grad; var += v (Keras SGD)",
}
LOSS_SCALINGS = {
    "dynamic": "float16 loss scale halved on overflow (the step skipped), doubled after 2000 steps",
    "fixed": "float16 loss times a fixed loss_scale, gradients divided by it, every step applied",
}


@dataclass(frozen=True)
class OptimizerConfig:
    name: str  # sgd | lars
    momentum: float
    weight_decay: float
    decay_all_variables: bool  # the reference decays BN and bias variables too
    base_learning_rate: float  # per 256 examples of global batch
    warmup_epochs: float
    schedule: str  # cosine | step
    step_boundaries: list[int]  # epochs, for the step schedule
    step_factor: float
    label_smoothing: float
    lars_eta: float
    # The recipe's forms (COSINE_STARTS, MOMENTUM_FORMS, LOSS_SCALINGS). The defaults are the
    # forms this project trained before the keys existed: configs saved then (run
    # directories, records) load as what they ran. The presets name their own.
    cosine_start: str = "warmup_end"
    momentum_form: str = "keras"
    loss_scaling: str = "dynamic"  # float16 only; bfloat16 and float32 scale no loss
    loss_scale: float = 256.0  # the fixed scale (the reference's --loss_scale default)

    def check(self) -> str | None:
        if self.name not in ("sgd", "lars"):
            return f"name must be 'sgd' or 'lars', got '{self.name}'"
        for problem in (
            choice_problem("cosine_start", self.cosine_start, COSINE_STARTS),
            choice_problem("momentum_form", self.momentum_form, MOMENTUM_FORMS),
            choice_problem("loss_scaling", self.loss_scaling, LOSS_SCALINGS),
            out_of_range(self, loss_scale=(1, 2**24)),
        ):
            if problem:
                return problem
        if not 0 <= self.momentum < 1:
            return f"momentum must be in [0, 1), got {self.momentum}"
        if not 0 < self.base_learning_rate <= 1000:
            return f"base_learning_rate must be in (0, 1000], got {self.base_learning_rate}"
        problem = out_of_range(
            self, weight_decay=(0, 1), warmup_epochs=(0, 10_000), step_boundaries=(0, 10_000)
        )
        if problem:
            return problem
        if self.schedule not in ("cosine", "step"):
            return f"schedule must be 'cosine' or 'step', got '{self.schedule}'"
        if not 0 <= self.label_smoothing < 1:
            return f"label_smoothing must be in [0, 1), got {self.label_smoothing}"
        if not 0 < self.lars_eta <= 1 or not 0 < self.step_factor <= 1:
            return "lars_eta and step_factor must be in (0, 1]"
        return None


def precision_policy_on(precision: str, on_gpu: bool) -> str:
    """Keras's policy name for `training.precision` (every framework's runner records it):
    fp32, or mixed precision: float16 with loss scaling (`optimizer.loss_scaling`) on any GPU
    (the reference's arithmetic, kept on GPUs that have bfloat16 too so that generations
    compare at one precision), bfloat16 on CPUs (the reduced precision oneDNN computes fast);
    `fp16` and `bf16` choose one by name."""
    if precision == "mixed":
        return "mixed_float16" if on_gpu else "mixed_bfloat16"
    return {"fp32": "float32", "fp16": "mixed_float16", "bf16": "mixed_bfloat16"}[precision]


def peak_learning_rate(config: OptimizerConfig, global_batch: int) -> float:
    """The learning rate after warm-up: the base rate scaled by global batch / 256."""
    return config.base_learning_rate * global_batch / 256


@dataclass(frozen=True)
class CommunicationConfig:
    """How workers talk (L3) and how long a worker waits for its peers before giving up."""

    collective: str  # auto | ring | nccl (tf.distribute CommunicationImplementation)
    timeout_s: float  # a peer silent (no heartbeat) this long is lost: the run stops (0: 10 s)
    join_timeout_s: float  # every worker must join the cluster within this (0: no limit)

    def check(self) -> str | None:
        if self.collective not in ("auto", "ring", "nccl"):
            return f"collective must be auto, ring or nccl, got '{self.collective}'"
        return out_of_range(self, timeout_s=(0, 86_400), join_timeout_s=(0, 86_400))


@dataclass(frozen=True)
class Setup:
    """A benchmark run's resolved and validated configuration."""

    benchmark: Benchmark
    preset: str
    config: dict
    training: TrainingConfig
    optimizer: OptimizerConfig
    communication: CommunicationConfig


def setup_from(benchmark: Benchmark, preset: str, config: dict) -> Setup:
    """Validate a resolved config (a preset's, or one carried by a record)."""
    check_numbers(config)
    training = section(TrainingConfig, config.get("training"), "training")
    optimizer = section(OptimizerConfig, config.get("optimizer"), "optimizer")
    communication = section(CommunicationConfig, config.get("communication"), "communication")
    workload_config.data_and_model(benchmark.name, config)  # the workload sections, checked now
    return Setup(benchmark, preset, config, training, optimizer, communication)


def prepare(benchmark_name: str, preset: str, overrides: list[str] = ()) -> Setup:
    """Resolve and validate a run's config (pure Python: nothing of TensorFlow runs)."""
    benchmark = load_benchmark(benchmark_name)
    if not benchmark.presets:
        raise UserError(f"benchmark '{benchmark_name}' cannot be trained yet: it has no presets")
    return setup_from(benchmark, preset, resolve_preset(benchmark, preset, overrides))


# ------------------------------------------------------- user config files and saved runs


def _apply_tables(resolved: dict, tables: dict, where: str) -> dict:
    """Sections of a user's config file merged over a resolved preset: only the keys the
    preset has, so that a misspelt key is refused rather than ignored."""
    for name, table in tables.items():
        if not isinstance(resolved.get(name), dict):
            known = ", ".join(k for k in resolved if isinstance(resolved[k], dict))
            raise UserError(f"{where}: unknown section '{name}' (sections: {known})")
        if not isinstance(table, dict):
            raise UserError(f"{where}: '{name}' must be a table")
        for key, value in table.items():
            if key not in resolved[name]:
                raise UserError(f"{where}: unknown key '{name}.{key}'")
            resolved[name][key] = value
    return resolved


def load_config_file(path: str | Path, overrides: list[str] = ()) -> Setup:
    """A user's TOML config: `benchmark`, the shipped preset it `inherits`, then any sections
    of the preset to change, e.g.

        benchmark = "image_classification"
        inherits = "smoke"
        [training]
        epochs = 3

    `--set` overrides apply after the file. The preset is named `INHERITS+STEM` in the record."""
    path = Path(path)
    data = _read_toml(path)
    name = _require(data, "benchmark", str, path, "")
    parent = _require(data, "inherits", str, path, "")
    benchmark = load_benchmark(name)
    resolved = resolve_preset(benchmark, parent)
    tables = {k: v for k, v in data.items() if k not in ("benchmark", "inherits")}
    resolved = _apply_tables(resolved, tables, str(path))
    resolved = _apply_tables(resolved, _override_tables(overrides), "--set")
    return setup_from(benchmark, f"{parent}+{path.stem}", resolved)


def _override_tables(overrides: list[str]) -> dict:
    tables: dict = {}
    for text in overrides:
        (section_name, key), value = _parse_override(text)
        tables.setdefault(section_name, {})[key] = value
    return tables


def run_setup(
    benchmark_name: str | None,
    preset: str | None,
    overrides: list[str] = (),
    config_file: str | None = None,
) -> Setup:
    """The config a command runs: a shipped preset (default smoke) or a user's config file."""
    if config_file:
        if preset is not None:
            raise UserError("--config and --preset exclude each other: the file names its preset")
        setup = load_config_file(config_file, overrides)
        if benchmark_name is not None and benchmark_name != setup.benchmark.name:
            raise UserError(
                f"{config_file}: is a config of {setup.benchmark.name}, not of {benchmark_name}"
            )
        return setup
    if benchmark_name is None:
        raise UserError("name the benchmark (image_classification or extreme_weather)")
    return prepare(benchmark_name, preset or "smoke", overrides)


def saved_config(setup: Setup) -> dict:
    """What a run directory keeps of its config (config.json): enough to resume it alone."""
    return {"benchmark": setup.benchmark.name, "preset": setup.preset, "config": setup.config}


def setup_of_run(run_dir: str | Path, file_name: str = "config.json") -> Setup | None:
    """The config a run directory was started with; None for a directory written before
    config.json named its benchmark (resume it with the benchmark and preset given again)."""
    path = Path(run_dir) / file_name
    if not path.is_file():
        raise UserError(f"{run_dir}: not a run directory (no {file_name})")
    saved = record_io.parse_json(record_io.read_regular_file(path, "run config"), path, "config")
    if not isinstance(saved, dict) or "config" not in saved:
        return None
    if not isinstance(saved.get("benchmark"), str) or not isinstance(saved.get("preset"), str):
        raise UserError(f"{path}: 'benchmark' and 'preset' must be strings")
    if not isinstance(saved["config"], dict):
        raise UserError(f"{path}: 'config' must be a table")
    return setup_from(load_benchmark(saved["benchmark"]), saved["preset"], saved["config"])


def resume_setup(
    run_dir: str | Path,
    benchmark_name: str | None,
    preset: str | None,
    overrides: list[str] = (),
    config_file: str | None = None,
) -> Setup:
    """The config to continue a stopped run with: the one saved in it. A config given as well
    must be the same one (otherwise the run would continue as another benchmark)."""
    saved = setup_of_run(run_dir)
    given = benchmark_name is not None or preset is not None or overrides or config_file
    if saved is None:
        if benchmark_name is None and not config_file:
            raise UserError(
                f"{run_dir}: its config.json does not name the benchmark (an older run): "
                "give the benchmark, --preset and --set values it was started with"
            )
        return run_setup(benchmark_name, preset, overrides, config_file)
    if not given:
        return saved
    if benchmark_name is None and preset is None and not config_file:  # --set alone
        config = copy.deepcopy(saved.config)
        setup = setup_from(
            saved.benchmark,
            saved.preset,
            _apply_tables(config, _override_tables(overrides), "--set"),
        )
    else:
        if preset is None and not config_file and saved.preset in saved.benchmark.presets:
            preset = saved.preset
        setup = run_setup(benchmark_name, preset, overrides, config_file)
    if setup.config != saved.config or setup.benchmark.name != saved.benchmark.name:
        raise UserError(
            f"{run_dir}: it was started with another config; resume it with the same "
            "benchmark, preset and --set values, or with --resume alone"
        )
    return saved


def without_data(setup: Setup, batch_per_replica: int | None = None) -> Setup:
    """The same run on random data: for what reads no data (counting FLOPs, the roofline),
    so that no dataset is needed; the model and precision stay the config's."""
    config = copy.deepcopy(setup.config)
    config["data"]["source"] = "random"
    if batch_per_replica is not None:
        if not 1 <= batch_per_replica <= 65_536:
            raise UserError(f"--batch must be in [1, 65536], got {batch_per_replica}")
        config["training"]["batch_per_replica"] = batch_per_replica
    return setup_from(setup.benchmark, setup.preset, config)


def roofline_setup(
    record_path: str | None,
    benchmark_name: str,
    preset: str,
    overrides: list[str] = (),
    batch_per_replica: int | None = None,
) -> tuple[Setup, dict | None]:
    """The workload the roofline places: a finished run's own config (from its record), or a
    preset's; on random data either way. Returns the setup and the record (or None)."""
    if record_path is None:
        setup = prepare(benchmark_name, preset, overrides)
        return without_data(setup, batch_per_replica), None
    run_record = record_io.load(record_path)
    if run_record["status"] == "imported" or run_record["source"].get("imported_from"):
        raise UserError(
            f"{record_path}: an imported record (a result from elsewhere, with no config of "
            "this project's): --record places a run this project trained; give --benchmark "
            "and --preset instead"
        )
    benchmark = load_benchmark(run_record["benchmark"])
    setup = setup_from(benchmark, run_record["preset"], run_record["config"])
    return without_data(setup, batch_per_replica), run_record
