"""Inputs crafted against the readers that the record checks let through: each was a
traceback, a wrong ranking or non-finite output before its fix, and is now one line, a note
or a result that says what it is."""

import json
from pathlib import Path

import pytest

from hpcai500_tf.cli import main
from hpcai500_tf.energy import meter_log
from hpcai500_tf.report import charts
from hpcai500_tf.run import throughput

from .conftest import EXAMPLE
from .test_instances import NOT_MEASURED


def _published() -> dict:
    return json.loads(EXAMPLE.read_text())


def _write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    (line,) = err.splitlines()
    return line


def _throughput_record(tmp_path: Path, energy: dict, log: str) -> Path:
    """A one-instance throughput record whose member has the published record and `log`."""
    member = tmp_path / "tp" / "instance-0"
    member.mkdir(parents=True)
    _write(member / "record.json", _published())
    (member / "mlperf.log").write_text(log)
    return _write(tmp_path / "tp" / throughput.FILE, {
        "schema_version": throughput.SCHEMA_VERSION, "kind": throughput.KIND,
        "form": "weak_scaling", "status": "completed", "benchmark": "image_classification",
        "preset": "x", "instances": 1, "workers_per_instance": 1, "placement": "local",
        "rule": dict(throughput.RULE),
        "members": [{"index": 0, "seed": 1, "run_dir": "instance-0", "exit_code": 0,
                     "ended": "exited 0", "hosts": []}],
        "window": {"start": None, "stop": None}, "energy": energy, "warnings": [],
        "source": {"tool": "t", "tool_version": "1"},
    })  # fmt: skip


def test_a_throughput_records_energy_has_a_records_shape(tmp_path, capsys):
    path = _throughput_record(tmp_path, {}, "")
    assert main(["score", str(path)]) == 2
    assert "missing key 'energy.measured'" in _one_line(capsys)


@pytest.mark.parametrize(
    "log",
    [
        ':::MLLOG {"key": "run_start", "time_ms": "1000"}\n',
        ":::MLLOG []\n",
        ':::MLLOG {"key": "run_start", "time_ms": 1e300}\n',
        ':::MLLOG {"key": "run_stop", "time_ms": 5000, "metadata": [1]}\n',
    ],
    ids=["string-time", "a-list", "beyond-float-seconds", "list-metadata"],
)
def test_a_members_odd_log_lines_are_left_out_of_the_window(tmp_path, capsys, log):
    path = _throughput_record(tmp_path, NOT_MEASURED, log)
    assert throughput.mlperf_times(path.parent / "instance-0" / "mlperf.log") == (None, None, None)
    assert main(["score", str(path)]) == 2
    assert "give no window" in _one_line(capsys)


def test_one_record_named_five_times_ranks_as_one_run(tmp_path, capsys):
    path = _write(tmp_path / "r.json", _published())
    assert main(["rank", *[str(path)] * 5, "--json"]) == 0
    ranking = json.loads(capsys.readouterr().out)
    (submission,) = ranking["submissions"]
    assert submission["runs"] == 1 and len(ranking["refused"]) == 4


def test_data_differences_that_are_not_a_list_are_named(tmp_path, capsys):
    rec = _published()
    rec["layers"]["L9"]["data_differences"] = 5
    path = _write(tmp_path / "r.json", rec)
    assert main(["rank", "--convention", "published-2020", str(path)]) == 2
    assert "'layers.L9.data_differences' must be a list of strings, got 5" in _one_line(capsys)


def test_an_mlperf_identity_without_a_system_name_ranks(tmp_path, capsys):
    rec = _published()
    rec["config"]["mlperf"] = {"system_folder": "x"}
    assert main(["rank", str(_write(tmp_path / "r.json", rec)), "--json"]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_zero_base_throughput_is_one_line_in_scaling(tmp_path, capsys):
    paths = []
    for workers, examples in ((1, 0), (2, 10)):
        rec = _published()
        rec["layers"]["L6"] = {"workers": workers, "global_batch": 64}
        rec["timeline"]["epochs"] = [
            {"epoch": 1, "elapsed_s": 1.0, "examples": examples, "seconds": 1.0}
        ]
        paths.append(str(_write(tmp_path / f"s{workers}.json", rec)))
    assert main(["scaling", *paths, "--out", str(tmp_path / "out")]) == 2
    assert "throughput of 0.0: none to scale" in _one_line(capsys)


def test_a_chart_matplotlib_cannot_place_is_a_note():
    note = charts.epoch_throughput_chart([(1.0, float("inf"))])
    assert note.startswith('<p class="missing">chart not drawn')
    assert charts.epoch_throughput_chart([(1.0, 5.0)]).startswith("<svg")  # the canvas is fine


def test_report_draws_a_run_of_an_extreme_epoch(tmp_path, capsys):
    rec = _published()
    rec["timeline"]["epochs"] = [{"epoch": 1, "elapsed_s": 1.0, "examples": 1000,
                                  "seconds": 5e-324}]  # fmt: skip
    path = _write(tmp_path / "r.json", rec)
    assert main(["report", str(path), "--out", str(tmp_path / "report")]) == 0


def test_meter_readings_beyond_a_gigawatt_are_unreadable_lines(tmp_path, capsys):
    log = tmp_path / "meter.csv"
    log.write_text("0,1e308\n100,1e308\n")
    assert main(["power", "--meter-log", str(log), "--json"]) == 2
    assert "fewer than two usable readings" in _one_line(capsys)
    log.write_text(f"0,{meter_log.MAX_WATTS:g}\n100,{meter_log.MAX_WATTS:g}\n")
    assert main(["power", "--meter-log", str(log), "--json"]) == 0


def test_an_optimizer_name_that_is_a_list_imports(tmp_path, capsys):
    from .test_mlperf_tree import ROUND_DIR, write_system

    pytest.importorskip("mlperf_logging.mllog", reason="pip install -e '.[test]'")
    tree = tmp_path / ROUND_DIR
    (log,) = write_system(tree / "Org", "sys", [(37, 3000)], None)
    named = '"key": "opt_name", "value": "lars"'
    assert named in log.read_text()
    log.write_text(log.read_text().replace(named, '"key": "opt_name", "value": ["lars"]'))
    assert main(["import-mlperf", str(tree), "--out", str(tmp_path / "out")]) == 0
    assert "imported 1 of 1" in capsys.readouterr().out
