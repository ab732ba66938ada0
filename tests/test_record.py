import json

import pytest

from hpcai500_tf import record
from hpcai500_tf.cli import main
from hpcai500_tf.errors import UserError


def test_round_trip(tmp_path, published_record):
    path = record.save(tmp_path / "run" / "record.json", published_record)
    assert record.load(path) == published_record
    assert [p.name for p in path.parent.iterdir()] == ["record.json"]  # no temp file left


def test_save_never_overwrites(tmp_path, published_record):
    path = record.save(tmp_path / "record.json", published_record)
    before = path.read_bytes()
    with pytest.raises(UserError, match="already exists"):
        record.save(path, published_record)
    assert path.read_bytes() == before


def test_invalid_record_is_not_written(tmp_path, published_record):
    published_record["quality"]["achieved"] = 1.5
    with pytest.raises(UserError, match="quality.achieved"):
        record.save(tmp_path / "record.json", published_record)
    assert list(tmp_path.iterdir()) == []


def test_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(TypeError):
        record.write_atomic(tmp_path / "x.json", {"not json": object()})
    assert list(tmp_path.iterdir()) == []


def _break(rec, dotted, value):
    *parents, last = dotted.split(".")
    target = rec
    for key in parents:
        target = target[key]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("schema_version", 99, "schema_version 99 is not supported"),
        ("kind", "something-else", "not an hpcai500 record"),
        ("quality", KeyError, "missing key 'quality'"),
        ("flops.method", KeyError, "missing key 'flops.method'"),
        ("quality.achieved", 1.2, "'quality.achieved' must be in \\(0, 1\\]"),
        ("quality.achieved", 0, "'quality.achieved' must be in \\(0, 1\\]"),
        ("quality.achieved", "high", "'quality.achieved' must be a finite number"),
        ("quality.time_to_quality_s", 0, "'quality.time_to_quality_s' must be > 0"),
        ("quality.time_to_quality_s", -3.0, "'quality.time_to_quality_s' must be > 0"),
        ("timeline.run_stop", -1.0, "'timeline.run_stop' must be after"),
        ("status", "won", "'status' must be one of"),
        ("flops.total", 1.0, "'flops.total' must be flops.per_example_training x"),
        ("energy.reason", None, "'energy.reason' must be a reason"),
        ("layers.L3", KeyError, "missing key 'layers.L3'"),
    ],
)
def test_bad_records_name_the_field(tmp_path, published_record, capsys, field, value, message):
    _break(published_record, field, value)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(published_record))
    with pytest.raises(UserError, match=message):
        record.load(path)
    assert main(["score", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "no such record file"), ("{not json", "not JSON"), ("[1, 2]", "must be a JSON object")],
)
def test_unreadable_files(tmp_path, capsys, content, message):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    assert main(["score", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
