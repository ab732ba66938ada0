"""Numbers and types at the edges: integers beyond float range refused where they are read,
derived numbers never printed as Infinity, TOML values JSON cannot carry refused by key, and
an import-mlperf that stays linear in the log's keys."""

import json

import pytest

from hpcai500_tf import compare, mlperf_import, record
from hpcai500_tf.cli import main
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
