"""Record text is shown as it is: terminal escapes and unpaired surrogates from a record never
reach the terminal raw or crash a table or page."""

import json

from hpcai500_tf.cli import main
from hpcai500_tf.report.text import printable

HOSTILE = "\x1b]0;owned\x07\x1b[2J\r\ud800 end"


def test_printable_writes_control_characters_and_surrogates_as_escapes():
    assert printable("plain text, tabs\tand\nlines") == "plain text, tabs\tand\nlines"
    assert printable(HOSTILE) == "\\x1b]0;owned\\x07\\x1b[2J\\x0d\\ud800 end"
    assert printable("\x9b31m") == "\\x9b31m"  # the one-byte CSI too
    assert printable(12.5) == "12.5"


def test_score_rank_compare_and_report_show_hostile_text_escaped(
    published_record, tmp_path, capsys
):
    published_record["preset"] = HOSTILE
    published_record["warnings"] = [HOSTILE]
    published_record["layers"]["L1"]["cpu_model"] = HOSTILE
    path = tmp_path / "record.json"
    path.write_text(json.dumps(published_record))  # ASCII JSON: the surrogate as \ud800
    other = tmp_path / "other.json"
    published_record["layers"]["L1"]["cpu_model"] = "another CPU"
    other.write_text(json.dumps(published_record))
    for argv in (
        ["score", str(path)],
        ["rank", str(path), str(other)],
        ["compare", str(path), str(other)],
        ["compare", str(path), str(other), "--json"],
        ["report", str(path), "--out", str(tmp_path / "pages")],
    ):
        assert main(argv) == 0, argv
        shown = capsys.readouterr().out
        assert "\x1b" not in shown and "\x07" not in shown and "\ud800" not in shown, argv
    pages = [page.read_text() for page in (tmp_path / "pages").glob("*.html")]
    assert pages and all("\x1b" not in page for page in pages)
    assert any("\\x1b]0;owned" in page for page in pages)
