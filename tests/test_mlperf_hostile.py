"""import-mlperf of results trees that are MLPerf's own but unusual (multi-node logs) or
hostile (counts, factors, names, links), and the ranking of what it imports: each a tree the
test makes, answered by one line per result file, the right exit code, no traceback."""

import json
import re
import shutil
from pathlib import Path

import pytest

from hpcai500_tf import record
from hpcai500_tf.cli import main
from hpcai500_tf.results import scoring

from .test_mlperf_tree import ROUND_DIR, named, one_line_error, write_log, write_system

pytest.importorskip("mlperf_logging.mllog", reason="pip install -e '.[test]'")


def _import(tree: Path, out: Path, capsys) -> tuple[int, list[str], str]:
    """import-mlperf TREE --out OUT: (exit code, stdout lines, stderr)."""
    code = main(["import-mlperf", str(tree), "--out", str(out)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out.splitlines(), captured.err


def _skipped(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("skipped ")]


# ------------------------------------------------------------------------ multi-node logs


def _header_variant(log: Path, key: str, old: str, new: str) -> None:
    """The log with the second node's `key` line stating `new` for `old`."""
    lines = log.read_text().splitlines()
    (second,) = [i for i, line in enumerate(lines) if f'"{key}"' in line and line.startswith("2:")]
    lines[second] = lines[second].replace(old, new)
    log.write_text("\n".join(lines) + "\n")


def test_a_multi_node_log_is_read_as_mlperf_reads_it_and_differing_values_are_refused(
    tmp_path, capsys
):
    """Every node's launcher logs the header at its own time: one fact each, at the first
    line's time; a node that states another value is named with both lines."""
    tree = tmp_path / ROUND_DIR
    paths = write_system(tree / "Org", "n4", [(37, 3000)] * 3, None, nodes=4)
    assert paths[0].read_text().count('"key": "submission_benchmark"') == 4
    _header_variant(paths[1], "submission_benchmark", '"value": "resnet"', '"value": "ssd"')
    code, lines, _ = _import(tree, tmp_path / "out", capsys)
    assert code == 0 and lines[-1].startswith("imported 2 of 3 result file(s)")
    (refused,) = _skipped(lines)
    assert re.fullmatch(
        r"skipped \S+result_1\.txt: 2 different 'submission_benchmark' lines \(line \d+: "
        r"'resnet'; line \d+: 'ssd'\); MLPerf logs it once, so which one holds is unclear",
        refused,
    ), refused
    rec = record.load(named(tmp_path / "out", "v4.0--Org--n4--result_0"))
    assert rec["warnings"] == []  # a multi-node header is MLPerf's form, not a fault
    assert rec["layers"]["L1"]["nodes"] == 4


def test_a_timed_line_at_two_times_is_still_refused(tmp_path, capsys):
    """run_start's time is its fact: the timed span is not one fact when it comes twice."""
    log = write_log(tmp_path / "Org/results/s/resnet/result_0.txt", start_ms=10**12,
                    epochs=8, epoch_ms=100, nodes=2)  # fmt: skip
    write_system(tmp_path / "Org", "s", [], None)
    lines = log.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if '"run_start"' in line)
    lines.insert(start + 1, lines[start].replace('"time_ms": ', '"time_ms": 1'))
    log.write_text("\n".join(lines) + "\n")
    code, _, err = _import(tmp_path / "Org", tmp_path / "out", capsys)
    assert code == 2 and "nothing imported" in err


# ------------------------------------------------------------------------ counts and factors


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("accelerators_per_node", "inf", "'accelerators_per_node' is 'inf', not a count in 0..1"),
        ("accelerators_per_node", "1e400", "is '1e400', not a count in 0..10000"),
        ("accelerators_per_node", "1e308", "is '1e308', not a count in 0..10000"),
        ("accelerators_per_node", 1e308, "is '1e+308', not a count in 0..10000"),
        ("accelerators_per_node", "-8", "is '-8', not a count in 0..10000"),
        ("accelerators_per_node", "2.5", "is '2.5', not a count in 0..10000"),
        ("accelerators_per_node", "\uff18", "not a count in 0..10000"),  # a fullwidth 8
        ("number_of_nodes", "1e308", "'number_of_nodes' is '1e308', not a count in 1..100000"),
        ("number_of_nodes", "0", "'number_of_nodes' is '0', not a count in 1..100000"),
        ("host_processors_per_node", "nan", "'host_processors_per_node' is 'nan', not a count"),
    ],
)  # fmt: skip
def test_a_description_count_that_is_not_one_lists_its_results_with_the_reason(
    tmp_path, capsys, field, value, words
):
    org = tmp_path / "Org"
    write_system(org, "bad", [(37, 3000)] * 2, None)
    write_system(org, "good", [(37, 3000)], None)
    path = org / "systems/bad.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    code, lines, _ = _import(org, tmp_path / "out", capsys)
    assert code == 0 and lines[-1].startswith("imported 1 of 3 result file(s)")
    assert len(_skipped(lines)) == 2
    for line in _skipped(lines):
        assert f"{path}: " in line and words in line, line
    (good,) = [record.load(p) for p in (tmp_path / "out").glob("*.json")]
    assert good["layers"]["L1"]["accelerator_count"] == 16


def test_a_record_holds_no_count_a_reader_refuses(tmp_path, published_record):
    from hpcai500_tf.errors import UserError

    published_record["layers"]["L1"]["accelerator_count"] = 10**616 * 9
    with pytest.raises(UserError) as error:
        record.save(tmp_path / "r.json", published_record)
    assert str(error.value) == (
        f"{tmp_path / 'r.json'}: 'layers.L1.accelerator_count' must be an integer within the "
        "range of a float, got one of about 617 digits"
    )
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    "text, words",
    [
        ('{"scaling_factor": 1e308}', "1e+308 is not in (0, 100]"),
        ('{"scaling_factor": 1e400}', "not a finite number: inf"),
        ('{"scaling_factor": 0}', "0 is not in (0, 100]"),
        ('{"scaling_factor": 100.5}', "100.5 is not in (0, 100]"),
        ('{"scaling_factor": "2"}', "not a finite number: '2'"),
        ('{"scaling_factor": true}', "not a finite number: True"),
    ],
)
def test_a_scaling_factor_out_of_range_is_refused_in_one_line(tmp_path, capsys, text, words):
    org = tmp_path / "Org"
    write_system(org, "s", [(37, 3000)] * 2, None)
    scaling = org / "results/s/resnet/scaling.json"
    scaling.write_text(text)
    code, lines, err = _import(org, tmp_path / "out", capsys)
    assert code == 2 and "nothing imported" in err
    for line in _skipped(lines):
        assert line.endswith(f"{scaling}: 'scaling_factor' is not a factor ({words})"), line


def _imported_system(tmp_path: Path, capsys, runs: int = 5) -> list[Path]:
    org = tmp_path / ROUND_DIR / "Org"
    write_system(org, "s", [(37, 3000 + 10 * i) for i in range(runs)], None)
    assert _import(org, tmp_path / "out", capsys)[0] == 0
    return sorted((tmp_path / "out").glob("*.json"))


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"scaling_factor": 1e308}, "config.mlperf.scaling_factor is not a factor (1e+308 is"),
        (
            {"run_start": -1.7e308, "run_stop": 1.7e308},
            "the score is not a finite number (time inf",
        ),
    ],
)
def test_a_hand_made_factor_or_span_out_of_range_is_refused_by_rank(
    tmp_path, capsys, change, reason
):
    """`rank --convention published-2020` never ends in a traceback (statistics.stdev of an
    infinite time once did): the record is refused, saying why, the rest ranked."""
    paths = _imported_system(tmp_path, capsys)
    data = json.loads(paths[0].read_text())
    if "scaling_factor" in change:
        data["config"]["mlperf"].update(change)
    else:
        data["timeline"].update(change)
        data["timeline"]["init_start"] = change["run_start"]  # an infinite span, finite ends
    paths[0].write_text(json.dumps(data))
    assert main(["rank", *map(str, paths), "--convention", "published-2020", "--json"]) == 0
    ranking = json.loads(capsys.readouterr().out)
    refused = {item["record"]: item["reasons"] for item in ranking["refused"]}
    assert list(refused) == [str(paths[0])] and refused[str(paths[0])][0].startswith(reason)
    (mine,) = [s for s in ranking["submissions"] if s["rule"] == "mlperf"]
    assert mine["runs"] == 4


# ------------------------------------------------------------------------ names and links


def test_names_that_differ_only_in_unsafe_characters_are_each_written_once(tmp_path, capsys):
    """Systems 'a+b' and 'a b' of one submitter, imported into one --out; the tree grows and
    is imported again; a record named by an earlier version is found by what it holds."""
    org, out = tmp_path / ROUND_DIR / "Org", tmp_path / "out"
    for system in ("a+b", "a b"):
        write_system(org, system, [(37, 3000)], None)
    code, lines, _ = _import(org, out, capsys)
    assert (code, lines) == (0, [f"imported 2 of 2 result file(s) into {out}; 0 skipped"])
    for system in ("a+b", "a b"):  # the tree grows: a second run of each
        write_system(org, system, [(37, 3000), (37, 3100)], None)
    old_name = out / "v4.0--Org--a-b--result_0.json"  # the name an earlier version gave
    first = sorted(out.glob("*.json"))[0]
    first.rename(old_name)
    code, lines, _ = _import(org, out, capsys)
    assert (code, lines) == (
        0, [f"imported 2 of 4 result file(s) into {out}; 2 already imported; 0 skipped"],
    )  # fmt: skip
    identities = [tuple(record.load(p)["config"]["mlperf"][k] for k in ("system", "result"))
                  for p in out.glob("*.json")]  # fmt: skip
    assert sorted(identities) == [(system, f"result_{n}.txt") for system in ("a b", "a+b")
                                  for n in (0, 1)]  # fmt: skip
    code, lines, _ = _import(org, out, capsys)
    assert (code, lines) == (
        0,
        [f"nothing new: 4 of 4 result file(s) already imported into {out} (kept, not "
         "rewritten); 0 skipped"],
    )  # fmt: skip


def test_a_file_of_the_records_name_that_is_not_its_record_is_kept(tmp_path, capsys):
    org, out = tmp_path / "Org", tmp_path / "out"
    write_system(org, "s", [(37, 3000)] * 2, None)
    assert _import(org, out, capsys)[0] == 0
    mine = named(out, "Org--s--result_0")
    mine.write_text("my notes\n")
    code, lines, _ = _import(org, out, capsys)
    assert code == 0 and mine.read_text() == "my notes\n"
    assert _skipped(lines) == [
        f"skipped {org}/results/s/resnet/result_0.txt: {mine} already exists and is not this "
        "result's record: kept, not overwritten"
    ]
    assert lines[-1].startswith("nothing new: 1 of 2 result file(s) already imported")


def test_a_system_folder_linked_under_a_second_submitter_counts_once(tmp_path, capsys):
    """T/OrgB/results/box -> T/OrgA/results/box: 3 result files, 3 records, one submission of
    3 runs, flagged; the second path of each listed as the same file."""
    tree, out = tmp_path / ROUND_DIR, tmp_path / "out"
    write_system(tree / "OrgA", "box", [(37, 3000), (37, 3100), (37, 3200)], None)
    write_system(tree / "OrgB", "other", [(37, 3000)], None)  # OrgB's systems/ and results/
    shutil.copy(tree / "OrgA/systems/box.json", tree / "OrgB/systems/box.json")
    (tree / "OrgB/results/box").symlink_to(tree / "OrgA/results/box")
    code, lines, _ = _import(tree, out, capsys)
    assert code == 0 and lines[-1] == f"imported 4 of 7 result file(s) into {out}; 3 skipped"
    for n, line in enumerate(_skipped(lines)):
        first = tree / f"OrgA/results/box/resnet/result_{n}.txt"
        assert line == (
            f"skipped {tree}/OrgB/results/box/resnet/result_{n}.txt: the same file as {first} "
            f"(both lead to {first.resolve()}): counted once, under its first path"
        )
    ranking = _rank(sorted(out.glob("*.json")))
    (box,) = [s for s in ranking["submissions"] if s["label"] == "OrgA box"]
    assert box["runs"] == 3 and box["notes"] == ["3 run(s): fewer than the 5 MLPerf asks"]
    # imported apart, the same files under OrgB are still one submission of 3 runs
    assert _import(tree / "OrgB", tmp_path / "out_b", capsys)[0] == 0
    again = sorted(out.glob("*.json")) + sorted((tmp_path / "out_b").glob("*--box--*.json"))
    ranking = _rank(again)
    (box,) = [s for s in ranking["submissions"] if s["label"] == "OrgA box"]
    assert box["runs"] == 3 and box["flagged"]
    twice = [r for r in ranking["refused"] if "out_b" in r["record"]]
    assert len(twice) == 3 and all(
        r["reasons"][0].startswith("the same MLPerf result file as ") for r in twice
    )


def _rank(paths: list[Path]) -> dict:
    records = [(str(p), record.load(p)) for p in paths]
    (ranking,) = scoring.rank_records(records, None, "free", convention="published-2020")
    return scoring.ranking_to_json(ranking)


def test_nothing_to_import_is_still_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "Org/results/s/resnet").mkdir(parents=True)
    (tmp_path / "Org/results/s/resnet/result_0.txt").write_text("no log\n")
    assert main(["import-mlperf", str(tmp_path / "Org"), "--out", str(tmp_path / "o")]) == 2
    assert "nothing imported: none of its 1 result file(s)" in one_line_error(capsys)
