"""Numbers and types at the edges: integers beyond float range refused where they are read,
derived numbers never printed as Infinity, TOML values JSON cannot carry refused by key, and
an import-mlperf that stays linear in the log's keys."""

import json

import pytest

from hpcai500_tf import record
from hpcai500_tf.cli import main
from hpcai500_tf.mlperf import mlperf_import
from hpcai500_tf.results import compare
from tests.conftest import EXAMPLE
from tests.test_compare import _hand_written, _log_line


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_an_integer_beyond_float_range_in_a_record_is_one_line(published_record, tmp_path, capsys):
    path = tmp_path / "huge.json"
    published_record["quality"]["examples_to_quality"] = 10**400
    path.write_text(json.dumps(published_record))
    for command in (["score", str(path)], ["compare", str(path), str(path)], ["rank", str(path)]):
        assert main(command) == 2
        assert "beyond the range of a float" in one_line_error(capsys)
    assert record.checked_integer(str(2**1023)) == 2**1023  # the largest still a float's


def test_a_record_that_cannot_be_scored_is_named_among_several(published_record, tmp_path, capsys):
    good, diverged = tmp_path / "good.json", tmp_path / "diverged.json"
    good.write_text(json.dumps(published_record))
    diverged.write_text(json.dumps({**published_record, "status": "diverged"}))
    assert main(["score", str(good), str(diverged)]) == 2
    assert one_line_error(capsys) == (
        f"hpcai500-tf: error: {diverged}: cannot score a run whose status is 'diverged'\n"
    )


def test_a_throughput_too_large_for_a_float_is_not_printed(published_record, tmp_path, capsys):
    tiny = json.loads(json.dumps(published_record))
    for epoch in tiny["timeline"]["epochs"]:
        epoch["seconds"] = 5e-324
    assert record.training_throughput(tiny) is None
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(published_record))
    b.write_text(json.dumps(tiny))
    assert main(["compare", str(a), str(b), "--json"]) == 0
    out = capsys.readouterr().out
    assert "Infinity" not in out and "NaN" not in out
    json.loads(out)  # strict JSON
    assert main(["compare", str(a), str(b)]) == 0
    assert " inf" not in capsys.readouterr().out
    assert compare.Metric("m", "x", 5e-324, 1e300).ratio is None


@pytest.mark.parametrize(
    "line, message",
    [
        ("when = 1979-05-27T07:32:00Z", "'when' is a TOML date or time"),
        ("[layers.L1]\nbuilt = 2020-07-02", "'layers.L1.built' is a TOML date or time"),
        ("epochs = " + "9" * 400, "'epochs' is an integer beyond the range of a float"),
        ("target_quality = 5e-324", "target_quality"),
    ],
)
def test_a_toml_sidecar_json_cannot_carry_is_one_line(tmp_path, capsys, line, message):
    log = _hand_written(tmp_path)
    sidecar = tmp_path / "sidecar.toml"
    sidecar.write_text('framework = "pytorch"\nflops_per_example = 2.0e10\n' + line + "\n")
    assert main(["import-mlperf", str(log), "--sidecar", str(sidecar)]) == 2
    assert message in one_line_error(capsys)
    assert not (tmp_path / "mlperf.log.record.json").exists()


def test_import_reads_each_key_once(tmp_path, monkeypatch):
    """50,000 distinct opt_* keys: every key's first value is found in one pass over the
    events (the old per-key scan was quadratic: 37 s here), so the scan of `_first` is not
    called per key."""
    extra = [_log_line(f"opt_k{i}", i) for i in range(50_000)]
    log = _hand_written(tmp_path, extra=extra)
    calls = []
    first = mlperf_import._first
    monkeypatch.setattr(mlperf_import, "_first", lambda *a: calls.append(1) or first(*a))
    rec, _ = mlperf_import.build_record(str(log), {"framework": "x", "flops_per_example": 1.0})
    assert rec["layers"]["L8"]["opt_k49999"] == 49_999
    assert len(calls) < 50


@pytest.mark.parametrize("depth", [600, 985])
def test_a_value_nested_hundreds_deep_is_output_or_one_line(published_record, tmp_path, depth):
    """A record Python's parser still reads (it refuses past ~990 levels) never overflows the
    stack in a command after it: every output is made without recursing per level."""
    import sys

    deep = []
    for _ in range(depth):
        deep = [deep]
    published_record["layers"]["L1"]["deep"] = deep
    path = tmp_path / "deep.json"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)  # only to write it
    try:
        path.write_text(json.dumps(published_record))
    finally:
        sys.setrecursionlimit(limit)
    for command in (
        ["score", str(path), "--json"],
        ["rank", str(path), "--json"],
        ["compare", str(path), str(EXAMPLE), "--json"],
        ["compare", str(path), str(EXAMPLE)],
        ["report", str(path), "--out", str(tmp_path / "pages")],
    ):
        code, out, err = _run(command)
        assert code in (0, 2) and "Traceback" not in err, (command, err[-500:])
        if code == 2:
            assert len(err.splitlines()) == 1, err
        elif "--json" in command:
            json.loads(out)


def _run(argv):
    import contextlib
    import io

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(argv)
    return code, stdout.getvalue(), stderr.getvalue()


def test_a_meter_log_too_small_to_score_leaves_energy_not_measured(tmp_path):
    """5e-324 W is a reading (finite, not negative) whose score per watt overflows: the run's
    record says energy was not measured and why, and stays scorable."""
    from hpcai500_tf.run.energy import energy_result
    from hpcai500_tf.run.progress import Progress

    log = tmp_path / "meter.csv"
    log.write_text("".join(f"{1000 + t},5e-324\n" for t in range(0, 30)))
    progress = Progress("f", segments=[{"start": 1002.0, "stop": 1020.0}], energy=[[]])
    energy, warnings = energy_result(progress, [], 0.0, str(log))
    assert energy["measured"] is False and "below 0.001 W" in energy["reason"]
    assert any("energy not measured" in w for w in warnings)


def test_junk_meter_log_lines_are_counted_not_kept(tmp_path):
    """200,000 junk lines (two fields, no reading): counted in one warning naming the first
    few, read line by line (the file is never held whole)."""
    from hpcai500_tf.energy.meter_log import read_meter_log

    log = tmp_path / "meter.csv"
    junk = "".join(f"x{i},y{i}\n" for i in range(200_000))
    log.write_text("timestamp,watts\n1000,300\n" + junk + "1010,310\n")
    readings, warnings = read_meter_log(log)
    assert readings == [(1000.0, 300.0), (1010.0, 310.0)]
    assert warnings == [f"{log}: 200000 unreadable line(s) skipped (line 3, 4, 5, 6, 7, ...)"]
