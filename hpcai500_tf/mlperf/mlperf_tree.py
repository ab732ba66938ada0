"""Records from an MLPerf Training results repository (mlcommons/training_results_vX.Y): one
per ResNet result file, its layers from the system's description and the log itself.

The layout is MLPerf's: ORG/results/SYSTEM/BENCHMARK/result_N.txt (the run's console output,
:::MLLOG lines of several ranks among other text) beside ORG/systems/SYSTEM.json. The tree
given may be a whole repository, one submitter's folder (results/, systems/), one system's
folder (results/SYSTEM) or one benchmark folder of it.

A record keeps, under config.mlperf, which result of which system it is: the results of one
system form one submission, scored as MLPerf scores it (`scoring`), with the factor of a
benchmark folder's scaling.json (MLPerf's review committee's normalisation, which
result_summarizer applies) where there is one. L9 is the problem the log
ran: MLPerf's ResNet target for the round and the epochs it trained; L7 is MLPerf's ResNet
(ResNet-50 v1.5 at 224x224), whose FLOPs per example come from `analytical_flops`.

A result that cannot be read is skipped with the reason and the others are imported; each
record is validated and written atomically, named by a readable slug and a digest of the
result's identity (`output_name`). A result file is counted once, by its resolved path (a
system folder linked under a second submitter adds no run). A result whose record is already
in the output directory (found by its identity, config.mlperf) is not written again; a file of
that name that is not its record is kept, never overwritten (the result skipped, saying so).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from hpcai500_tf import record as record_io
from hpcai500_tf.errors import UserError
from hpcai500_tf.mlperf import analytical_flops, mlperf_import, mlperf_system
from hpcai500_tf.mlperf.mlperf_import import LINE, epoch_of
from hpcai500_tf.results.scoring import scaling_factor_problem

RESULTS, SYSTEMS, RESNET, SCALING = "results", "systems", "resnet", "scaling.json"
ROUND = re.compile(r"training_results_v(\d+\.\d+)")
# MLPerf Training's ResNet target (top-1) in the rounds that log :::MLLOG lines, v0.7 to v4.0
# (training_0.7.0 to training_4.0.0/closed_resnet.yaml of mlperf-logging's compliance checker;
# v0.5 and v0.6 wrote another format, which read_log does not take).
TARGET = 0.759
# Lines MLPerf logs once per run (the compliance checker's EXACTLY_ONE keys this reads); of
# them, those whose time is what they state (the timed run's bounds).
ONCE = ("submission_benchmark", "init_stop", "run_start", "run_stop", "global_batch_size",
        "train_samples")  # fmt: skip
TIMED = ("init_stop", "run_start", "run_stop")
IMAGENET_TRAIN_EXAMPLES = 1_281_167


@dataclass(frozen=True)
class ResultFile:
    """One result_N.txt and the system it belongs to."""

    path: Path  # under the tree as the user named it
    submitter: str
    system: str
    benchmark: str  # the folder's name (MLPerf's benchmark name)
    description: Path  # ORG/systems/SYSTEM.json
    system_folder: Path  # results/SYSTEM, resolved: who the submission is
    round: str | None


@dataclass
class TreeImport:
    """What an import did: each result file written, found already imported (its record) or
    skipped (with the reason), and the warnings of those written."""

    found: int = 0
    written: list[Path] = field(default_factory=list)
    existing: list[Path] = field(default_factory=list)  # this result's record, already there
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    warnings: list[tuple[Path, str]] = field(default_factory=list)


def _folders(path: Path) -> list[Path]:
    try:
        return sorted(child for child in path.iterdir() if child.is_dir())
    except OSError as error:
        raise UserError(f"{path}: cannot list it ({error.strerror or error})") from None


def _benchmark_folders(tree: Path) -> list[tuple[str, Path, Path, Path]]:
    """(submitter, ORG folder, system folder, benchmark folder) for each benchmark folder of
    the tree, whichever of the four layouts it is."""
    root = tree.resolve()
    above = [*root.parents[:3], *[Path("/")] * 3]  # parent, grandparent, great-grandparent
    if (root / RESULTS).is_dir():
        organisations = [(root.name, tree)]
    elif above[0].name == RESULTS:
        return [(above[1].name, above[1], tree, b) for b in _folders(tree)]
    elif above[1].name == RESULTS:
        return [(above[2].name, above[2], above[0], tree)]  # the parent of what `tree` is
    else:
        organisations = [(o.name, o) for o in _folders(tree) if (o / RESULTS).is_dir()]
    return [
        (name, organisation, system, benchmark)
        for name, organisation in organisations
        for system in _folders(organisation / RESULTS)
        for benchmark in _folders(system)
    ]


def _result_number(path: Path) -> tuple[int, str]:
    digits = re.fullmatch(r"result_(\d+)\.txt", path.name)
    return (int(digits.group(1)) if digits else 1 << 62, path.name)


def find_results(tree: Path) -> list[ResultFile]:
    """Every result_N.txt of the tree, in order (UserError where the tree is no directory)."""
    try:
        if not tree.is_dir():
            raise UserError(f"{tree}: not a directory (an MLPerf results tree is one)")
        found = ROUND.search(str(tree.resolve()))
    except OSError as error:
        raise UserError(f"{tree}: {error.strerror or error}") from None
    results = []
    for submitter, organisation, system, benchmark in _benchmark_folders(tree):
        system_folder = system.resolve()
        description = organisation.resolve() / SYSTEMS / f"{system_folder.name}.json"
        for path in sorted(benchmark.glob("result_*.txt"), key=_result_number):
            results.append(
                ResultFile(path, submitter, system_folder.name, benchmark.resolve().name,
                           description, system_folder, found.group(1) if found else None)
            )  # fmt: skip
    return results


def scaling_factor(folder: Path) -> float | None:
    """The factor of a benchmark folder's scaling.json ({"scaling_factor": X}), None without
    one; UserError for one that cannot be read or is not in (0, scoring.MAX_SCALING_FACTOR]."""
    path = folder / SCALING
    if not (path.exists() or path.is_symlink()):
        return None
    data = record_io.parse_json(record_io.read_regular_file(path, "scaling file"), path, "file")
    factor = data.get("scaling_factor") if isinstance(data, dict) else None
    problem = scaling_factor_problem(factor)
    if problem:
        raise UserError(f"{path}: 'scaling_factor' is not a factor ({problem})")
    return float(factor)


def identity_digest(result: ResultFile) -> str:
    """10 hex digits of sha256 over the result's identity: round, submitter, system,
    benchmark and result file name."""
    return hashlib.sha256(json.dumps(identity_of(result)).encode()).hexdigest()[:10]


def output_name(result: ResultFile) -> str:
    """The record's file name: [vROUND--]SUBMITTER--SYSTEM--result_N--DIGEST.json, each part
    in safe characters (at most 60) for reading, the digest of the result's identity for
    telling apart names that differ only in what the slug drops ('a+b', 'a b')."""
    parts = [f"v{result.round}"] if result.round else []
    parts += [result.submitter, result.system, result.path.stem]
    safe = [re.sub(r"[^A-Za-z0-9._-]+", "-", part)[:60].strip(".-") or "x" for part in parts]
    return "--".join([*safe, identity_digest(result)]) + ".json"


IDENTITY = ("round", "submitter", "system", "benchmark", "result")  # of config.mlperf


def identity_of(result: ResultFile) -> tuple:
    """The result's identity as config.mlperf names it (IDENTITY)."""
    return (result.round, result.submitter, result.system, result.benchmark, result.path.name)


def imported_results(out: Path) -> dict[tuple, Path]:
    """The records of MLPerf results already in `out`, by identity (whatever their file
    names: a record named by an earlier version is found too); files that are not such a
    record are left out."""
    found: dict[tuple, Path] = {}
    try:
        paths = sorted(out.glob("*.json"))
    except OSError:
        return found
    for path in paths:
        try:
            data = record_io.parse_json(record_io.read_regular_file(path, "record"), path, "")
            identity = data["config"]["mlperf"]
            found.setdefault(tuple(identity.get(key) for key in IDENTITY), path)
        except (UserError, KeyError, TypeError, AttributeError):
            continue
    return found


def single_log_record(
    log_path: str, sidecar: dict, benchmark_name: str | None = None
) -> tuple[dict, list[str]]:
    """`import-mlperf LOG`'s record, its log read as a tree's logs are (MLPerf's tools'
    reading): a header every node repeats read once, two that differ refused naming both
    lines, lines out of order refused."""
    path = Path(log_path)
    events, warnings = mlperf_import.read_log(path)
    events, repeated = check_events(events, path)
    return mlperf_import.record_from_events(
        events, warnings + repeated, path, sidecar, benchmark_name
    )


def check_events(events: list[dict], path: Path) -> tuple[list[dict], list[str]]:
    """The log's events with repeated lines read once, as MLPerf's result_summarizer and
    compliance checker read them (see `_once_facts`), and lines out of order refused
    (UserError): the timed run's epochs and evaluations before run_start, or going back.
    Lines repeated word for word are read once with a warning."""
    unique, seen, repeated = [], set(), []
    for event in events:
        key = (
            event["time_ms"],
            event["key"],
            repr(event.get("value")),
            repr(event.get("metadata")),
        )
        if key in seen:
            repeated.append(event[LINE])
        else:
            seen.add(key)
            unique.append(event)
    warnings = []
    if repeated:
        warnings.append(f"{len(repeated)} repeated :::MLLOG line(s) read once (line {repeated[0]})")
    unique, lines = _once_facts(unique, path)
    _check_order(unique, lines, path)
    return unique, warnings


def _fact(event: dict) -> tuple:
    """What a line MLPerf logs once states: its value; for a timing line (TIMED) also its
    time and its metadata but where in the source it was logged."""
    value = event.get("value")
    fact: tuple = (type(value) is bool, value)
    if event["key"] in TIMED:
        where = ("file", "lineno")
        metadata = {k: v for k, v in (event.get("metadata") or {}).items() if k not in where}
        fact += (event["time_ms"], json.dumps(metadata, sort_keys=True, default=str))
    return fact


def _shown(event: dict) -> str:
    if event["key"] in TIMED:
        return f"line {event[LINE]}: time_ms {event['time_ms']!r:.40}"
    return f"line {event[LINE]}: {event.get('value')!r:.60}"


def _once_facts(events: list[dict], path: Path) -> tuple[list[dict], dict[str, list[int]]]:
    """Each line MLPerf logs once (ONCE) read as one fact: a repetition stating the same (a
    multi-node log's header, logged by every node's launcher at its own time) is that fact,
    at its first line's time, as result_summarizer reads the first and the compliance checker
    only warns; two that state different values are refused (UserError), naming both lines.
    A timing line's time is its fact: two run_start lines at different times are refused
    (MLPerf's tools read them unalike: the compliance checker warns, result_summarizer reads
    the last run_start before the first run_stop; the timed span is not one fact)."""
    firsts: dict[str, dict] = {}
    kept = []
    for event in events:
        name = event["key"]
        if name not in ONCE:
            kept.append(event)
            continue
        first = firsts.setdefault(name, event)
        if first is event:
            kept.append(event)
        elif _fact(event) != _fact(first):
            raise UserError(
                f"{path}: 2 different '{name}' lines ({_shown(first)}; {_shown(event)}); "
                "MLPerf logs it once, so which one holds is unclear"
            )
    return kept, {name: [firsts[name][LINE]] if name in firsts else [] for name in ONCE}


def _check_order(events: list[dict], lines: dict[str, list[int]], path: Path) -> None:
    start, stop = lines["run_start"], lines["run_stop"]
    if start and stop and stop[0] < start[0]:
        raise UserError(
            f"{path}: run_stop (line {stop[0]}) comes before run_start (line {start[0]}): "
            "the log's lines are out of order"
        )
    last: dict[str, tuple[float, float]] = {}
    for event in events:
        if event["key"] not in ("epoch_stop", "eval_accuracy"):
            continue
        if start and event[LINE] < start[0]:
            raise UserError(
                f"{path}: line {event[LINE]}: {event['key']} before run_start (line "
                f"{start[0]}): the log's lines are out of order"
            )
        now = (epoch_of(event, path), float(event["time_ms"]))
        before = last.get(event["key"], now)
        if now[0] < before[0] or now[1] < before[1]:
            raise UserError(
                f"{path}: line {event[LINE]}: {event['key']} of epoch {now[0]:g} at "
                f"{now[1]:.0f} ms after one of epoch {before[0]:g} at {before[1]:.0f} ms: "
                "the log's lines are out of order"
            )
        last[event["key"]] = now


def problem(events: list[dict], result: ResultFile, path: Path) -> dict:
    """L9: the problem the log ran: MLPerf's ResNet target (one for every round read) and
    the epochs the log trained."""
    epochs = max(
        (epoch_of(e, path) for e in events if e["key"] in ("epoch_stop", "eval_accuracy")),
        default=0,
    )
    examples = mlperf_import.first_values(events).get("train_samples")
    dataset = "imagenet-1k"
    if examples != IMAGENET_TRAIN_EXAMPLES:
        dataset = f"unknown: train_samples {examples!r:.40}, ImageNet-1k's is 1281167"
    round_text = f"v{result.round}" if result.round else "(round not named by the tree)"
    return {
        "dataset": dataset,
        "quality_metric": "top1_accuracy",
        "target_quality": TARGET,
        "epochs": int(epochs) if float(epochs).is_integer() else epochs,
        "target_source": f"MLPerf Training {round_text}: ResNet's top-1 target, v0.7 to v4.0",
        "epochs_source": "the epochs the log trained (its last epoch_stop or eval_accuracy)",
    }


def programming_model(events: list[dict], hardware: dict) -> dict:
    """L6: the global batch of the log, the workers the log states (number_of_nodes x
    accelerators_per_node), else one per accelerator of the system description."""
    values = mlperf_import.first_values(events)
    nodes, per_node = values.get("number_of_nodes"), values.get("accelerators_per_node")
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (nodes, per_node)):
        workers, source = nodes * per_node, "the log's number_of_nodes x accelerators_per_node"
    elif hardware.get("accelerator_count"):
        workers = hardware["accelerator_count"]
        source = "assumed from the system description: one data-parallel worker per accelerator"
    else:
        workers, source = None, "stated neither by the log nor by the system description"
    batch = values.get("global_batch_size")
    layer = {
        "parallelism": "data_parallel",
        "synchronous": True,
        "global_batch": batch,
        "workers": workers,
        "workers_source": source,
    }
    if workers and isinstance(batch, int) and batch % workers == 0:
        layer["batch_per_worker"] = batch // workers
    if "gradient_accumulation_steps" in values:
        layer["gradient_accumulation_steps"] = values["gradient_accumulation_steps"]
    return layer


def hyperparameters(events: list[dict]) -> dict:
    """L8: the log's optimizer keys, seed and label smoothing, and the same under the
    project's names where the log has them (optimizer, momentum, warm-up, ...)."""
    logged = mlperf_import.log_hyperparameters(events)
    optimizer = logged.get("opt_name")
    optimizer = optimizer if isinstance(optimizer, str) else None  # kept as logged below
    named = {"optimizer": {"sgd": "sgd_momentum"}.get(optimizer, optimizer)}
    for name, suffix in (
        ("base_learning_rate", "base_learning_rate"),
        ("momentum", "momentum"),
        ("weight_decay", "weight_decay"),
        ("warmup_epochs", "learning_rate_warmup_epochs"),
    ):
        for key in (f"{optimizer}_opt_{suffix}", f"opt_{suffix}"):
            if key in logged:
                named[name] = logged[key]
                break
    return {**{k: v for k, v in named.items() if v is not None}, **logged}


def result_record(
    result: ResultFile, description: dict, given: dict, scaling: float | None = None
) -> tuple[dict, list[str]]:
    """The record of one result file; `given` holds what the command line replaces
    (framework, framework_version, flops_per_example), `scaling` the factor of the folder's
    scaling.json."""
    events, warnings = mlperf_import.read_log(result.path)
    events, repeated = check_events(events, result.path)
    named = mlperf_import.first_values(events).get("submission_benchmark")
    if named is not None and named != RESNET:
        raise UserError(f"{result.path}: the log is MLPerf's '{named!s:.40}', not ResNet")
    layers = mlperf_system.system_layers(description, result.description)
    for key in ("framework", "framework_version"):
        if given.get(key) is not None:
            layers["L5"][key] = given[key]
    layers["L6"] = programming_model(events, layers["L1"])
    layers["L7"] = {
        "model": "resnet50_v1.5",
        "image_size": 224,
        "num_classes": 1000,
        "source": "MLPerf Training's ResNet: ResNet-50 v1.5 at 224x224 on ImageNet-1k",
    }
    layers["L8"] = hyperparameters(events)
    layers["L9"] = problem(events, result, result.path)
    flops = analytical_flops.resnet50_v15_training_flops()
    if given.get("flops_per_example") is not None:
        flops |= {
            "per_example_training": float(given["flops_per_example"]),
            "method": "given on the command line (--flops-per-example)",
            "basis": "submitter",
        }
    sidecar = {
        "framework": layers["L5"]["framework"],
        "flops_per_example": flops["per_example_training"],
        "preset": "mlperf",
        "layers": layers,
    }
    identity = {
        "round": result.round,
        "submitter": result.submitter,
        "system": result.system,
        "benchmark": result.benchmark,
        "result": result.path.name,
        "system_description": str(result.description),
        "system_folder": str(result.system_folder),
        "division": description.get("division"),
        "availability": description.get("status"),
        "scaling_factor": scaling,
    }
    if scaling is not None:
        warnings.append(f"its time is scaled by {scaling:g} ({SCALING} beside it), as MLPerf's")
    record_config = {"imported_from": str(result.path), "mlperf": identity, "given": given}
    return mlperf_import.record_from_events(
        events, warnings + repeated, result.path, sidecar, "image_classification",
        record_config, flops,
    )  # fmt: skip


def _once(cache: dict, key: Path, read):
    """What `read(key)` gives, or the UserError it raises, read once per key."""
    if key not in cache:
        try:
            cache[key] = read(key)
        except UserError as error:
            cache[key] = error
    return cache[key]


def _first_path(result: ResultFile, seen: dict[Path, Path]) -> str | None:
    """Why a result file is not counted: it is a file already listed under another path (a
    system folder linked under a second submitter, say), or its path cannot be resolved."""
    try:
        resolved = result.path.resolve()
    except (OSError, RuntimeError) as error:  # RuntimeError: a symlink loop (Python < 3.13)
        return f"cannot resolve its path ({getattr(error, 'strerror', None) or error})"
    first = seen.setdefault(resolved, result.path)
    if first == result.path:
        return None
    return f"the same file as {first} (both lead to {resolved}): counted once, under its first path"


def import_tree(tree: Path, out: Path, given: dict) -> TreeImport:
    """Import every ResNet result of `tree` into `out` (see the module's doc). UserError only
    where the tree holds no result file at all."""
    results = find_results(tree)
    if not results:
        raise UserError(
            f"{tree}: no MLPerf result files under it (ORG/results/SYSTEM/BENCHMARK/"
            "result_N.txt beside ORG/systems/SYSTEM.json)"
        )
    done = TreeImport(found=len(results))
    descriptions: dict[Path, dict | UserError] = {}
    factors: dict[Path, float | None | UserError] = {}
    seen: dict[Path, Path] = {}
    already = imported_results(out)
    for result in results:
        why = _first_path(result, seen)
        if why is None and result.benchmark != RESNET:
            why = f"MLPerf's '{result.benchmark}' (its folder), not ResNet: only ResNet is imported"
        if why is None and identity_of(result) in already:
            done.existing.append(already[identity_of(result)])
            continue
        target = out / output_name(result)
        if why is None and (target.exists() or target.is_symlink()):
            why = f"{target} already exists and is not this result's record: kept, not overwritten"
        if why is None:
            why = _import_one(result, target, given, descriptions, factors, done)
        if why is not None:
            done.skipped.append((result.path, why))
    return done


def _import_one(result, target, given, descriptions, factors, done: TreeImport) -> str | None:
    """Write the record of one result file to `target`; why not, where it cannot be."""
    description = _once(descriptions, result.description, mlperf_system.read_description)
    factor = _once(factors, result.path.parent, scaling_factor)
    for error in (description, factor):
        if isinstance(error, UserError):
            return str(error)
    try:
        record, warnings = result_record(result, description, given, factor)
        record_io.save(target, record)
    except UserError as error:
        return str(error)
    except OSError as error:  # the output directory: the next result may fare no better
        return f"cannot write {target} ({error.strerror})"
    done.written.append(target)
    done.warnings += [(result.path, warning) for warning in warnings]
    return None
