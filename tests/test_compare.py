"""Comparing records (one layer changed, everything else checked equal) and importing MLPerf
logs of any framework."""

import copy
import json
import re
from pathlib import Path

import pytest

from hpcai500_tf import config, record
from hpcai500_tf.cli import main
from hpcai500_tf.errors import UserError
from hpcai500_tf.mlperf import mlperf_import, mlperf_tree
from hpcai500_tf.results import compare

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------ comparison logic


def test_equal_layers_are_repeat_runs_not_a_comparison(published_record):
    result = compare.compare(published_record, copy.deepcopy(published_record))
    assert result.differing_layers == [] and not result.valid
    assert "repeat runs" in result.verdict
    assert all(m.ratio in (None, 1.0) for m in result.metrics)


def test_one_differing_layer_is_a_valid_comparison(published_record):
    other = copy.deepcopy(published_record)
    other["layers"]["L5"] = {**other["layers"]["L5"], "framework": "pytorch"}
    other["quality"]["time_to_quality_s"] /= 2  # twice as fast
    result = compare.compare(published_record, other)
    assert result.valid and result.differing_layers == ["L5"]
    assert [(d.field, d.b) for d in result.differences] == [("framework", "pytorch")]
    metrics = {m.name: m for m in result.metrics}
    assert metrics["Time to quality"].ratio == pytest.approx(0.5)
    assert metrics["FLOPS"].ratio == pytest.approx(2.0)
    assert metrics["Valid FLOPS"].ratio == pytest.approx(2.0)


def test_the_power_compared_is_the_power_a_score_divides_by(published_record):
    """Worker 0's watts of a run whose other workers' energy was not gathered are no
    machine's power: shown as none, as its Valid FLOPS per watt is."""
    measured = {"measured": True, "reason": None, "joules": 39600.0, "interval_s": 132.0,
                "scope": "node (meter log)", "average_watts": 300.0, "coverage": 1.0,
                "sample_hz": 1.0, "parts_measured": ["node"], "parts_not_measured": [],
                "quality_flags": [], "sources": []}  # fmt: skip
    whole, partial = copy.deepcopy(published_record), copy.deepcopy(published_record)
    whole["energy"] = {**measured, "average_watts": 2400.0, "joules": 316800.0}
    partial["energy"] = {**measured, "parts_not_measured": [
        "workers 1-7: energy not gathered (the run was stopped by SIGTERM)"]}  # fmt: skip
    metrics = {m.name: m for m in compare.compare(partial, whole).metrics}
    assert (metrics["Average power"].a, metrics["Average power"].b) == (None, 2400.0)
    assert metrics["Average power"].ratio is None


def test_several_differing_layers_are_named(published_record):
    other = copy.deepcopy(published_record)
    other["layers"]["L1"] = {**other["layers"]["L1"], "summary": "another machine"}
    other["layers"]["L5"] = {**other["layers"]["L5"], "framework": "pytorch"}
    result = compare.compare(published_record, other)
    assert not result.valid and result.differing_layers == ["L1", "L5"]
    assert "L1 (hardware), L5 (framework) differ" in result.verdict


def test_a_different_problem_is_not_comparable(published_record):
    other = copy.deepcopy(published_record)
    other["layers"]["L9"] = {**other["layers"]["L9"], "target_quality": 0.75}
    assert "problem (L9" in compare.compare(published_record, other).verdict


def test_fields_one_side_lacks_leave_the_layer_unknown(published_record):
    other = copy.deepcopy(published_record)
    other["layers"]["L5"] = {**other["layers"]["L5"], "framework": "pytorch"}
    other["layers"]["L2"] = {"os": "Linux"}  # the published entry does not say
    result = compare.compare(published_record, other)
    assert not result.valid and result.differing_layers == ["L5"]
    assert {u.layer for u in result.unknown} == {"L2"}
    assert "cannot confirm" in result.verdict


def test_compare_command_json(tmp_path, published_record, capsys):
    other = copy.deepcopy(published_record)
    other["layers"]["L5"] = {**other["layers"]["L5"], "framework": "pytorch"}
    paths = []
    for name, rec in (("a.json", published_record), ("b.json", other)):
        (tmp_path / name).write_text(json.dumps(rec))
        paths.append(str(tmp_path / name))
    assert main(["compare", *paths, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid_single_layer_comparison"] and report["differing_layers"] == ["L5"]
    assert main(["compare", paths[0], str(tmp_path / "missing.json")]) == 2


# ------------------------------------------------------------------------ MLPerf importer


def test_importing_the_projects_own_log_gives_back_its_results(tf_tiny, tmp_path):
    path, original = tf_tiny
    sidecar = {
        "framework": "tensorflow",
        "flops_per_example": original["flops"]["per_example_training"],
        "preset": "tiny",
        "target_quality": original["quality"]["target"],
        "epochs": original["layers"]["L9"]["epochs"],
        "dataset": original["layers"]["L9"]["dataset"],
        "layers": original["layers"],
    }
    sidecar_path = tmp_path / "sidecar.json"
    sidecar_path.write_text(json.dumps(sidecar))
    out = tmp_path / "imported.json"
    log = path.parent / "mlperf.log"
    assert main(["import-mlperf", str(log), "--sidecar", str(sidecar_path), "--out", str(out)]) == 0
    imported = record.load(out)
    assert imported["status"] == "imported" and imported["source"]["imported_from"] == str(log)
    q, r = imported["quality"], original["quality"]
    assert q["achieved"] == r["achieved"] and q["reached_target"] == r["reached_target"]
    assert q["examples_to_quality"] == r["examples_to_quality"]
    assert q["time_to_quality_s"] == pytest.approx(r["time_to_quality_s"], abs=0.01)
    assert [p["value"] for p in q["curve"]] == [p["value"] for p in r["curve"]]
    result = compare.compare(original, imported)
    assert result.differing_layers == [] and "repeat runs" in result.verdict
    assert main(["import-mlperf", str(log), "--sidecar", str(sidecar_path), "--out", str(out)]) == 2


def _log_line(key, value=None, time_ms=1000, **metadata):
    event = {
        "namespace": "",
        "time_ms": time_ms,
        "event_type": "POINT_IN_TIME",
        "key": key,
        "value": value,
        "metadata": metadata,
    }
    return ":::MLLOG " + json.dumps(event)


def _hand_written(tmp_path, drop=(), extra=()):
    lines = [
        "some framework banner",
        _log_line("submission_benchmark", "resnet"),
        _log_line("global_batch_size", 256),
        _log_line("train_samples", 1024),
        _log_line("opt_name", "sgd"),
        _log_line("run_start", time_ms=10_000),
        _log_line("epoch_stop", time_ms=20_000, epoch_num=1),
        _log_line("eval_accuracy", 0.5, time_ms=21_000, epoch_num=1),
        _log_line("epoch_stop", time_ms=30_000, epoch_num=2),
        _log_line("eval_accuracy", 0.8, time_ms=31_000, epoch_num=2),
        _log_line("run_stop", time_ms=32_000, status="success"),
        *extra,
    ]
    lines = [line for line in lines if not any(f'"key": "{key}"' in line for key in drop)]
    path = tmp_path / "mlperf.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_run_whose_last_evaluation_is_0_is_stopped_and_says_so():
    """Scored by the quality it ends with, a completed run whose last evaluation is 0 has no
    result, even where an earlier one was above 0: it is recorded as stopped, and the warning
    names the last evaluation."""
    from hpcai500_tf.results.record_builder import build_record

    curve = [
        {"epoch": 1, "elapsed_s": 1.0, "examples": 8, "value": 0.07},
        {"epoch": 2, "elapsed_s": 2.0, "examples": 16, "value": 0.0},
    ]
    warnings = []
    rec = build_record(
        config.load_benchmark("extreme_weather"), preset="tiny", status="completed", tool="t",
        framework="tensorflow", layers={"L9": {}}, config={}, curve=curve,
        timeline={"init_start": 0.0, "run_start": 0.0, "run_stop": 2.0, "segments": [],
                  "epochs": []},
        metric="mAP@0.5", target=0.01, measured=True, flops={"per_example_training": 1.0},
        energy={}, warnings=warnings,
        artifacts={},
    )  # fmt: skip
    assert rec["status"] == "stopped" and rec["quality"]["achieved"] is None
    assert warnings == ["the last evaluation's quality is 0 (mAP@0.5): no result to score"]


def test_a_hand_written_pytorch_log_is_imported(tmp_path):
    log = _hand_written(tmp_path, extra=["{broken", ":::MLLOG {not json"])
    rec, warnings = mlperf_import.build_record(
        str(log), {"framework": "pytorch", "flops_per_example": 2.0e10}
    )
    assert (
        rec["benchmark"] == "image_classification" and rec["layers"]["L5"]["framework"] == "pytorch"
    )
    quality = rec["quality"]
    assert quality["reached_target"] and quality["time_to_quality_s"] == pytest.approx(21.0)
    assert quality["examples_to_quality"] == 2048
    assert rec["flops"]["total"] == pytest.approx(2.0e10 * 2048)
    assert rec["layers"]["L8"]["opt_name"] == "sgd"
    assert any("1 unreadable :::MLLOG line(s)" in w for w in warnings)
    assert rec["energy"]["measured"] is False
    record.validate(rec)


@pytest.mark.parametrize(
    "drop, message",
    [
        (("run_start",), "lacks keys the record needs: run_start"),
        (("eval_accuracy", "train_samples"), "train_samples (the epoch size"),
        (("global_batch_size",), "global_batch_size (the global batch)"),
    ],
)
def test_logs_lacking_keys_are_refused_naming_them(tmp_path, drop, message):
    log = _hand_written(tmp_path, drop=drop)
    with pytest.raises(UserError, match=re.escape(message)):
        mlperf_import.build_record(str(log), {"framework": "x", "flops_per_example": 1.0})


def test_a_single_log_reads_repeated_headers_once_and_refuses_conflicting_ones(tmp_path):
    sidecar = {"framework": "x", "flops_per_example": 1.0}
    # A multi-node log: every node's launcher logs the header, at its own time.
    repeated = _hand_written(tmp_path, extra=[_log_line("global_batch_size", 256, time_ms=1_300)])
    record, warnings = mlperf_tree.single_log_record(str(repeated), sidecar)
    assert record["layers"]["L6"]["global_batch"] == 256
    conflicting = _hand_written(
        tmp_path, extra=[_log_line("global_batch_size", 512, time_ms=1_300)]
    )
    with pytest.raises(UserError, match=r"2 different 'global_batch_size' lines \(line 3: 256; "):
        mlperf_tree.single_log_record(str(conflicting), sidecar)


def test_what_the_log_cannot_say_must_be_given(tmp_path, capsys):
    log = _hand_written(tmp_path)
    assert main(["import-mlperf", str(log), "--framework", "pytorch"]) == 2
    assert "--flops-per-example" in capsys.readouterr().err
    percent = _hand_written(
        tmp_path, extra=[_log_line("eval_accuracy", 76.3, time_ms=31_500, epoch_num=3)]
    )
    with pytest.raises(UserError, match="not a fraction"):
        mlperf_import.build_record(str(percent), {"framework": "x", "flops_per_example": 1.0})
    not_a_log = tmp_path / "notes.txt"
    not_a_log.write_text("hello\n")
    with pytest.raises(UserError, match="not an MLPerf log"):
        mlperf_import.build_record(str(not_a_log), {"framework": "x", "flops_per_example": 1.0})
    bad_sidecar = tmp_path / "s.json"
    bad_sidecar.write_text('{"flops": 3}')
    with pytest.raises(UserError, match="unknown key 'flops'"):
        mlperf_import.read_sidecar(str(bad_sidecar))
