"""The verdict (`score`, `rank`): one target, SPEC section 3's reading, imported logs held to
the epoch budget, FLOP bases named, old records re-read, and the published 2020 ranking
reproduced."""

import copy
import json
from pathlib import Path

import pytest

from hpcai500_tf import config, record
from hpcai500_tf.cli import main
from hpcai500_tf.errors import UserError
from hpcai500_tf.mlperf import mlperf_import
from hpcai500_tf.results import scoring

from .conftest import set_result
from .test_compare import _hand_written, _log_line

PUBLISHED = sorted((Path(__file__).resolve().parents[1] / "examples/published_2020").glob("*.json"))


@pytest.fixture(scope="module")
def ic():
    return config.load_benchmark("image_classification")


@pytest.fixture(scope="module")
def levels():
    return config.load_levels()


# ------------------------------------------------------------------------ the published ranking


def test_the_nine_published_entries_come_back_in_the_published_order(ic, levels):
    records = [(str(p), record.load(p)) for p in PUBLISHED]
    assert len(records) == 9
    published_order = sorted(records, key=lambda r: r[1]["config"]["published"]["rank"])
    for convention in ("stated", "published-2020"):
        ranking = scoring.rank(records, ic, levels[0]["free"], levels[1], convention=convention)
        assert not ranking.refused and not ranking.warnings
        assert [s.paths[0] for s in ranking.submissions] == [p for p, _ in published_order]


def test_the_ranking_conventions_bring_back_each_published_figure(ic):
    """n = 10 over ResNet-50 v1's analytical count: every row within 3 % but Facebook's
    (+6 %: its '60 min' is a round figure; 0.70 PFLOPS implies 63 min at that budget). The
    stated n = 5 leaves the rows below target 2.7-12 % high."""
    outside = {}
    for path in PUBLISHED:
        rec = record.load(path)
        published = rec["config"]["published"]["valid_pflops"] * 1e15
        ours = scoring.score(rec, ic, convention="published-2020").valid_flops
        if abs(ours / published - 1) > 0.03:
            outside[path.stem] = round(ours / published - 1, 3)
        stated = scoring.score(rec, ic).valid_flops
        if rec["quality"]["achieved"] < 0.763:
            assert stated / published - 1 > 0.02  # the stated rule leaves them high
    assert outside == {"9_facebook": pytest.approx(0.06, abs=0.005)}


def test_rank_places_a_users_record_among_the_published_ones(published_record, tmp_path, capsys):
    mine = set_result(copy.deepcopy(published_record), seconds=400.0, quality=0.765)
    mine["layers"]["L1"] = {"summary": "my cluster"}
    mine["flops"]["basis"] = "tensorflow-profiler"
    mine["flops"]["per_example_training"] = 24.42e9
    mine["flops"]["total"] = 24.42e9 * mine["quality"]["examples_to_quality"]
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(mine))
    assert main(["rank", str(path), "--published", "--json"]) == 0
    stated, ranking_own = json.loads(capsys.readouterr().out)
    assert (stated["convention"], ranking_own["convention"]) == ("stated", "published-2020")
    labels = [s["label"] for s in stated["submissions"]]
    assert len(labels) == 10 and labels.index("my cluster") == 3  # between Sony and Tencent
    assert "different bases" in stated["warnings"][0]  # its own v1.5 profile vs v1 analytical
    assert not ranking_own["warnings"]  # the ranking's convention recounts every record alike
    mine_there = next(s for s in ranking_own["submissions"] if s["label"] == "my cluster")
    assert mine_there["flop_basis"] == ["analytical-resnet50-v1"]


# ------------------------------------------------------------------------ one target


def test_a_record_whose_target_disagrees_with_its_problem_is_refused(published_record):
    edited = copy.deepcopy(published_record)
    edited["quality"]["target"] = 0.5
    with pytest.raises(UserError, match=r"quality.target.*layers.L9.target_quality = 0.763"):
        record.validate(edited)
    edited = copy.deepcopy(published_record)
    edited["quality"]["metric"] = "top5_accuracy"
    with pytest.raises(UserError, match="quality.metric"):
        record.validate(edited)


def test_reached_target_must_agree_with_the_quality(published_record):
    edited = copy.deepcopy(published_record)
    edited["quality"]["achieved"] = 0.7
    with pytest.raises(UserError, match="reached_target"):
        record.validate(edited)


def test_an_import_takes_its_target_from_the_problem_it_states(tmp_path):
    log = _hand_written(tmp_path)
    sidecar = {
        "framework": "pytorch",
        "flops_per_example": 2e10,
        "layers": {"L9": {"dataset": "imagenet-1k", "target_quality": 0.5, "epochs": 2}},
    }
    rec, _ = mlperf_import.build_record(str(log), sidecar)
    assert rec["quality"]["target"] == rec["layers"]["L9"]["target_quality"] == 0.5
    record.validate(rec)
    assert not rec["rankable"]


# ------------------------------------------------------------------------ SPEC section 3


def test_the_score_reads_the_end_of_the_run_and_keeps_the_first_crossing():
    curve = [
        {"epoch": 84, "elapsed_s": 840.0, "examples": 84, "value": 0.75},
        {"epoch": 88, "elapsed_s": 880.0, "examples": 88, "value": 0.7631},
        {"epoch": 90, "elapsed_s": 900.0, "examples": 90, "value": 0.760},
    ]
    result = record.quality_result(curve, 0.763, measured=True)
    assert result["achieved"] == 0.760 and not result["reached_target"]
    assert result["time_to_quality_s"] == 900.0 and result["examples_to_quality"] == 90
    assert result["first_crossing"] == curve[1]


def test_an_import_that_trained_fewer_epochs_than_the_budget_is_not_rankable(tmp_path):
    log = _hand_written(tmp_path)  # two epochs; the benchmark's budget is 90
    rec, _ = mlperf_import.build_record(str(log), {"framework": "x", "flops_per_example": 1.0})
    assert any(
        "trained 2 epochs, fewer than the problem's 90" in r for r in rec["not_rankable_reasons"]
    )
    lines = log.read_text().splitlines()
    lines.insert(-1, _log_line("eval_accuracy", 0.9, time_ms=31_500, epoch_num=90))
    log.write_text("\n".join(lines) + "\n")
    rec, _ = mlperf_import.build_record(str(log), {"framework": "x", "flops_per_example": 1.0})
    assert not any("fewer than" in r for r in rec["not_rankable_reasons"])


def test_a_schema_1_record_is_re_read_at_the_end_of_its_run(published_record, tmp_path, ic):
    v1 = copy.deepcopy(published_record)
    v1["schema_version"] = 1
    del v1["flops"]["basis"], v1["quality"]["reading"], v1["quality"]["first_crossing"]
    v1["quality"]["curve"] = [
        {"epoch": 80, "elapsed_s": 100.0, "examples": 1000, "value": 0.765},
        {"epoch": 90, "elapsed_s": 132.0, "examples": 1125, "value": 0.761},
    ]
    v1["quality"].update(  # schema 1 timed the first evaluation on target
        achieved=0.765, final=0.761, time_to_quality_s=100.0, examples_to_quality=1000
    )
    v1["flops"]["total"] = v1["flops"]["per_example_training"] * 1000
    path = tmp_path / "old.json"
    path.write_text(json.dumps(v1))
    loaded = record.load(path)
    assert loaded["schema_version"] == record.SCHEMA_VERSION
    assert loaded["flops"]["basis"] == "analytical-resnet50-v1"
    score = scoring.score(loaded, ic)
    assert score.time_to_quality_s == 132.0 and score.quality == 0.761
    assert score.first_crossing_s == 100.0
    assert score.total_flops == pytest.approx(loaded["flops"]["per_example_training"] * 1125)
    assert json.loads(path.read_text())["schema_version"] == 1  # the file is left as it was


# ------------------------------------------------------------------------ FLOP basis


def test_an_unknown_flop_basis_is_refused(published_record):
    edited = copy.deepcopy(published_record)
    edited["flops"]["basis"] = "guessed"
    with pytest.raises(UserError, match="flops.basis"):
        record.validate(edited)


def test_score_warns_when_records_count_flops_differently(published_record, tmp_path, capsys):
    other = copy.deepcopy(published_record)
    other["flops"]["basis"] = "tensorflow-profiler"
    for name, rec in (("a.json", published_record), ("b.json", other)):
        (tmp_path / name).write_text(json.dumps(rec))
    assert main(["score", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    assert "FLOPs counted on different bases" in capsys.readouterr().out


def test_score_warns_when_profiled_counts_ran_over_different_kernels(published_record):
    """The profiler counts the ops that ran: the fused batch norm of the CPU workarounds has no
    count, stock batch norm's ops do, so two such runs' FLOPS are not alike."""
    ic = config.load_benchmark("image_classification")
    scores = []
    for kernels in ("cpu-workarounds", "stock", "stock", "cpu-native-batch-norm"):
        rec = copy.deepcopy(published_record)
        rec["flops"]["basis"] = "tensorflow-profiler"
        rec["layers"]["L7"]["kernels"] = kernels
        scores.append(scoring.score(rec, ic))
    assert scoring.mixed_bases(scores[1:3]) is None
    assert "tensorflow-profiler (stock kernels)" in scoring.mixed_bases(scores)
    # The native batch norm's step is counted as the workarounds' is: the same basis.
    assert scoring.mixed_bases([scores[0], scores[3]]) is None


def test_an_unknown_convention_is_one_line(published_record, tmp_path, capsys):
    (tmp_path / "a.json").write_text(json.dumps(published_record))
    assert main(["score", str(tmp_path / "a.json"), "--convention", "nope"]) == 2
    assert "unknown scoring convention 'nope'" in capsys.readouterr().err


# ------------------------------------------------------------------------ level rules


def _pinned_value(pin):
    """A value a pin allows: the value itself, or the first of `{ one_of = [...] }`."""
    return copy.deepcopy(pin["one_of"][0] if isinstance(pin, dict) else pin)


def _reference_record(published_record, benchmark):
    """A record whose fixed layers are the benchmark's reference values."""
    rec = copy.deepcopy(published_record)
    for layer, values in benchmark.reference_layers.items():
        pinned = {key: _pinned_value(pin) for key, pin in values.items()}
        rec["layers"][layer] = {**rec["layers"][layer], **pinned}
    rec["layers"]["L8"]["seed"] = 10
    return rec


def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value * 2 + 1
    if isinstance(value, list):
        return value[:-1]
    return value + "-changed"


PINS = [
    (level, layer, field)
    for level, fixed in (
        ("system", ("L5", "L6", "L7", "L8")),
        ("hardware", ("L5", "L6", "L7", "L8")),
    )
    for layer, values in config.load_benchmark("image_classification").reference_layers.items()
    if layer in fixed and not (level == "system" and layer in ("L5", "L6"))
    for field in values
]


@pytest.mark.parametrize("level, layer, field", PINS, ids=["-".join(p) for p in PINS])
def test_a_pinned_field_changed_is_refused_with_the_rule_named(
    published_record, ic, levels, level, layer, field
):
    rec = _reference_record(published_record, ic)
    assert not scoring.refusal(rec, ic, levels[0][level])  # the reference itself may rank
    rec["layers"][layer][field] = _changed(rec["layers"][layer][field])
    (reason,) = scoring.refusal(rec, ic, levels[0][level])
    assert reason.startswith(f"{layer} ") and f": {field} " in reason
    assert f"(fixed at the {level} level)" in reason
    assert not scoring.refusal(rec, ic, levels[0]["free"])  # the free level lets it change


def test_the_pins_are_the_reference_presets_values(ic):
    """reference_layers and the reference preset must not drift apart."""
    preset = config.prepare("image_classification", "reference", [])
    l7, l8 = ic.reference_layers["L7"], ic.reference_layers["L8"]
    model, data, opt = preset.config["model"], preset.config["data"], preset.optimizer
    assert (l7["width"], l7["blocks"]) == (model["width"], model["blocks"])
    assert (l7["image_size"], l7["num_classes"]) == (data["image_size"], data["num_classes"])
    assert (l8["momentum"], l8["weight_decay"], l8["decay_all_variables"]) == (
        opt.momentum, opt.weight_decay, opt.decay_all_variables
    )  # fmt: skip
    assert (l8["base_learning_rate"], l8["warmup_epochs"], l8["label_smoothing"]) == (
        opt.base_learning_rate, opt.warmup_epochs, opt.label_smoothing
    )  # fmt: skip
    assert "precision" not in l7 and "seed" not in l8  # left free, levels.toml says why
    # the forms in which the reference trains (docs/image_classification.md)
    for key in ("zero_init_residual", "logits_initializer", "stride_padding"):
        assert l7[key] == model[key], key
    assert l7["input_normalisation"] == model["input_normalisation"]
    assert (l8["cosine_start"], l8["momentum_form"]) == (opt.cosine_start, opt.momentum_form)
    assert opt.loss_scaling in l8["loss_scaling"]["one_of"]


def _old_record(published_record, benchmark):
    """A record as this project wrote it before its L7 and L8 named the recipe's forms: the
    reference's values in every field it had, none of the fields added since."""
    rec = _reference_record(published_record, benchmark)
    for key in ("zero_init_residual", "logits_initializer", "stride_padding"):
        del rec["layers"]["L7"][key]
    del rec["layers"]["L7"]["input_normalisation"]
    del rec["layers"]["L8"]["cosine_start"], rec["layers"]["L8"]["momentum_form"]
    rec["layers"]["L8"]["loss_scaling"] = "dynamic"
    return rec


def test_a_record_from_before_the_forms_were_recorded_is_refused_naming_each(
    published_record, ic, levels
):
    """It trained gamma 0 and the old schedule, but does not say so: not reference-equivalent
    at the system level, each unrecorded field named; the free level ranks it."""
    rec = _old_record(published_record, ic)
    reasons = scoring.refusal(rec, ic, levels[0]["system"])
    named = [reason.split(": ", 1)[1].split(" ", 1)[0] for reason in reasons]
    assert named == [
        "zero_init_residual",
        "logits_initializer",
        "stride_padding",
        "input_normalisation",
        "cosine_start",
        "momentum_form",
    ]
    assert all("(not recorded) differs from the reference" in reason for reason in reasons)
    assert not scoring.refusal(rec, ic, levels[0]["free"])


@pytest.mark.parametrize(
    "layer, field, value",
    [
        ("L7", "zero_init_residual", True),
        ("L7", "logits_initializer", "normal_0.01"),
        ("L7", "stride_padding", "same"),
        ("L7", "input_normalisation", "mean_std"),
        ("L8", "cosine_start", "warmup_end"),
        ("L8", "momentum_form", "keras"),
        ("L8", "loss_scaling", "fixed"),
    ],
)
def test_the_projects_earlier_forms_rank_at_the_free_level_only(
    published_record, ic, levels, layer, field, value
):
    rec = _reference_record(published_record, ic)
    rec["layers"][layer][field] = value
    assert not scoring.refusal(rec, ic, levels[0]["free"])
    for level in ("system", "hardware"):
        (reason,) = scoring.refusal(rec, ic, levels[0][level])
        assert reason.startswith(f"{layer} ") and f": {field} {value!r} differs" in reason


def test_float32_and_bfloat16_records_scale_no_loss_and_still_match(published_record, ic, levels):
    """The reference scales float16 losses dynamically; runs in other precisions scale none."""
    rec = _reference_record(published_record, ic)
    for scaling in ("dynamic", "none"):
        rec["layers"]["L8"]["loss_scaling"] = scaling
        assert not scoring.refusal(rec, ic, levels[0]["system"])
    rec["layers"]["L8"]["loss_scaling"] = "fixed"
    (reason,) = scoring.refusal(rec, ic, levels[0]["system"])
    assert "loss_scaling 'fixed' differs from the reference one of 'dynamic', 'none'" in reason


def test_a_malformed_pin_is_one_line(tmp_path):
    text = (config.CONFIG_DIR / "image_classification.toml").read_text()
    text = text.replace('loss_scaling = { one_of = ["dynamic", "none"] }', "loss_scaling = {}")
    (tmp_path / "image_classification.toml").write_text(text)
    with pytest.raises(UserError, match=r"'reference_layers.L8.loss_scaling' must be a value or"):
        config.load_benchmark("image_classification", tmp_path)


# ------------------------------------------------------------------------ repeatability


def test_runs_that_differ_only_in_seed_are_one_submission(published_record, ic, levels):
    runs = []
    for seed, seconds in enumerate((130.0, 131.0, 132.0, 133.0, 134.0)):
        rec = set_result(copy.deepcopy(published_record), seconds=seconds, quality=0.763)
        rec["layers"]["L8"] = {"seed": seed}
        runs.append((f"seed{seed}", rec))
    (submission,) = scoring.rank(runs, ic, levels[0]["free"], levels[1]).submissions
    assert len(submission.paths) == 5 and not submission.notes
    assert submission.time_to_quality_s == pytest.approx(132.0)  # olympic: 130 and 134 dropped
    other = copy.deepcopy(runs[0][1])
    other["layers"]["L8"]["momentum"] = 0.9  # not only the seed: another submission
    ranking = scoring.rank([*runs, ("other", other)], ic, levels[0]["free"], levels[1])
    assert sorted(len(s.paths) for s in ranking.submissions) == [1, 5]


def test_more_than_one_run_missing_the_target_refuses_the_submission(published_record, ic, levels):
    qualities = (0.763, 0.764, 0.765, 0.760, 0.761)
    runs = [
        (f"r{i}", set_result(copy.deepcopy(published_record), seconds=132.0, quality=q))
        for i, q in enumerate(qualities)
    ]
    ranking = scoring.rank(runs, ic, levels[0]["free"], levels[1])
    assert not ranking.submissions and len(ranking.refused) == 5
    assert "2 of 5 missed the target; at most 1 may" in ranking.refused[0][1][0]
    ranking = scoring.rank(runs[:4], ic, levels[0]["free"], levels[1])  # one miss is allowed
    (submission,) = ranking.submissions
    assert submission.notes == ["4 run(s): fewer than the 5 a result needs (MLPerf's rule)"]


def test_compare_shows_each_sides_flop_basis_and_warns_when_they_differ(published_record):
    from hpcai500_tf.results import compare

    other = copy.deepcopy(published_record)
    other["layers"]["L5"] = {"framework": "pytorch"}
    same = compare.compare(published_record, other)
    assert same.flop_bases == ("analytical-resnet50-v1",) * 2 and not same.warnings
    other["flops"]["basis"] = "pytorch-flop-counter"
    mixed = compare.to_json(compare.compare(published_record, other), "a", "b")
    assert mixed["flop_basis"] == {"a": "analytical-resnet50-v1", "b": "pytorch-flop-counter"}
    assert "different bases" in mixed["warnings"][0]
