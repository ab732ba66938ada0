"""The ranking page as a leaderboard, read the way a person reads it: a generated MLPerf round
of 40 systems and 200 results (made as tests/test_mlperf_tree.py makes trees: mllog's own
lines, checked system descriptions), imported and reported, then opened in headless Chromium.
A script added to a copy of the page measures it there: the columns' rendered widths against
their headers' longest words at 1280 and 400 px, the rows after a sort by Valid FLOPS and after
a filter by accelerator, every chart's axis labels. The system pages' mean is the ranking's."""

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hpcai500_tf import record
from hpcai500_tf.cli import main
from hpcai500_tf.report import pages as report_pages
from hpcai500_tf.report.html_parts import POLICY
from hpcai500_tf.results import scoring

from .test_mlperf_tree import ROUND_DIR, description, write_log

# (accelerator model, examples/s of one accelerator): four models, so that colours and the
# per-accelerator chart have something to show
MODELS = [("NVIDIA H100-SXM5-80GB", 3000), ("NVIDIA A100-SXM4-80GB", 1300),
          ("AMD Instinct MI300X", 2400), ("Intel Gaudi2", 1500)]  # fmt: skip
IMAGENET = 1_281_167
ABORTED = ("Org3", "sys3_2")  # the system with a run that did not converge


def make_round(root: Path) -> Path:
    """8 submitters x 5 systems x 5 results: node counts 1 to 16, four accelerator models,
    final qualities a little above the target that differ by system (so that HPC AI500's
    order and MLPerf's differ), one system with an aborted run."""
    tree = root / ROUND_DIR
    for org in range(8):
        for index in range(5):
            system = f"sys{org}_{index}"
            model, speed = MODELS[(org + index) % len(MODELS)]
            nodes = (1, 2, 4, 8, 16)[(org * 3 + index) % 5]
            efficiency = 0.95 ** (nodes.bit_length() - 1)
            epoch_ms = int(IMAGENET / (speed * 8 * nodes * efficiency) * 1000)
            folder = tree / f"Org{org}"
            desc = description(folder.name, system, nodes, 8, model, "PyTorch NVIDIA 24.04",
                               "CUDA 12.4, NCCL 2.21")  # fmt: skip
            (folder / "systems").mkdir(parents=True, exist_ok=True)
            (folder / "systems" / f"{system}.json").write_text(json.dumps(desc))
            final = 0.7595 + 0.0021 * ((org * 7 + index * 3) % 5)
            for run in range(5):
                aborted = (folder.name, system) == ABORTED and run == 1
                write_log(folder / "results" / system / "resnet" / f"result_{run}.txt",
                          start_ms=1_700_000_000_000 + run * 10**8, epochs=37 + run % 2 * 4,
                          epoch_ms=epoch_ms + 7 * run, seed=run + 1, org=folder.name,
                          final=0.62 if aborted else final, aborted=aborted, ranks=2,
                          optimizer="sgd")  # fmt: skip
    return tree


@pytest.fixture(scope="module")
def reported(tmp_path_factory) -> tuple[Path, Path]:
    """(the imported records, the report's pages)."""
    root = tmp_path_factory.mktemp("round")
    tree = make_round(root)
    records, pages = root / "records", root / "pages"
    assert main(["import-mlperf", str(tree), "--out", str(records)]) == 0
    assert len(list(records.glob("*.json"))) == 200
    # These tests read the ranking and the system pages, never the 200 run pages, whose two
    # charts each were most of this fixture's time: a placeholder stands in for each run page
    # (an imported record's run page: test_mlperf_tree's report test; a round of 200 results
    # reported whole: its slow test).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(report_pages, "run_page", lambda run, with_index: "<p>run page</p>")
        arguments = ["report", *map(str, sorted(records.glob("*.json"))), "--out", str(pages)]
        assert main(arguments) == 0
    assert len(list(pages.glob("v4.0--*.html"))) == 200
    return records, pages


def _ranking(records: Path) -> scoring.Ranking:
    loaded = [(str(path), record.load(path)) for path in sorted(records.glob("*.json"))]
    (ranking,) = scoring.rank_records(loaded, None, "free", convention=scoring.PUBLISHED)
    return ranking


def _rows(index: str) -> list[dict]:
    """The published reading's leaderboard rows: their data-* and cells' data-sort values."""
    part = index.split('id="ranking-image_classification-published-2020"')[1]
    rows = []
    for attributes, cells in re.findall(r"<tr ([^>]*)>(.*?)</tr>", part.split("</table>")[0]):
        row = dict(re.findall(r'data-(\w+)="([^"]*)"', attributes))
        row["cells"] = [html.unescape(v) for v in re.findall(r'<td data-sort="([^"]*)"', cells)]
        rows.append(row)
    return rows


def test_one_row_per_system_with_the_leaderboards_columns(reported):
    records, pages = reported
    index = (pages / "index.html").read_text()
    rows = _rows(index)
    ranking = _ranking(records)
    assert len(rows) == len(ranking.submissions) == 49  # 40 systems and the 2020 table's nine
    assert [float(row["cells"][7]) for row in rows] == [s.valid_flops for s in ranking.submissions]
    aborted = next(row for row in rows if row["cells"][1] == "org3 sys3_2")
    assert aborted["cells"][2:6] == ["org3", "nvidia a100-sxm4-80gb", "16", "2"]
    assert aborted["cells"][13] == "5" and aborted["rankable"] == "no"
    assert aborted["source"] == "MLPerf Training v4.0"
    assert {row["source"] for row in rows} == {"MLPerf Training v4.0", "published 2020"}
    per_accelerator = float(aborted["cells"][11])
    assert per_accelerator == pytest.approx(float(aborted["cells"][7]) / 16)
    assert index.count("<svg") == 3 and POLICY in index
    # no address but the SVG namespaces' names (which are never fetched)
    assert not re.search(r"https?://", re.sub(r'xmlns(:\w+)?="[^"]*"', "", index))


def test_the_system_page_works_the_olympic_mean_through_to_the_rankings(reported):
    records, pages = reported
    (n,) = [s for s in _ranking(records).submissions if s.label == "Org3 sys3_2"]
    assert len(n.not_converged) == 1 and len(n.paths) == 4
    index = (pages / "index.html").read_text()
    link = re.search(r'<a href="(system-[^"]*Org3-sys3_2[^"]*)">Org3 sys3_2</a>', index)
    page = (pages / link.group(1)).read_text()
    mean = float(re.search(r'id="olympic-mean" data-value="([^"]+)"', page).group(1))
    assert mean == n.valid_flops  # the same runs, the same sum, the same order
    row = next(r for r in _rows(index) if r["cells"][1] == "org3 sys3_2")
    assert float(row["cells"][7]) == mean
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))
    assert text.count("did not converge (counts as the slowest; dropped)") == 1
    assert text.count("dropped: the fastest") == 1 and text.count(": counted") == 0
    assert text.count("counted") == 3
    assert page.count("<svg") == 1 and "L1" in text and "system description" in text
    assert "NVIDIA A100-SXM4-80GB" in text


# ------------------------------------------------------------------------ in a browser

MEASURE = r"""
<script>
(function () {
  function longest(th) {  // the rendered width of the header's longest word, in its own font
    var probe = document.createElement("span"), widest = 0;
    probe.style.whiteSpace = "nowrap"; probe.style.position = "absolute";
    th.querySelector("button").appendChild(probe);
    th.textContent.split(/\s+/).forEach(function (word) {
      probe.textContent = word; widest = Math.max(widest, probe.getBoundingClientRect().width);
    });
    probe.remove();
    return widest;
  }
  function columns() {
    var headers = document.querySelectorAll("table.leaderboard th");
    return Array.prototype.map.call(headers, function (th) {
      var style = getComputedStyle(th);
      var inner = th.getBoundingClientRect().width - parseFloat(style.paddingLeft)
        - parseFloat(style.paddingRight);
      return [th.textContent, inner, longest(th)];
    });
  }
  var table = document.querySelector("#ranking-image_classification-published-2020 table");
  function visible() {
    return Array.prototype.filter.call(table.tBodies[0].rows, function (r) { return !r.hidden; })
      .map(function (r) { return [r.cells[1].querySelector("a").textContent, r.dataset.accelerator,
                                  r.cells[7].dataset.sort]; });
  }
  var out = {columns: columns(), scroll: [table.parentNode.scrollWidth,
                                          table.parentNode.clientWidth]};
  var header = table.querySelectorAll("th")[9];  // time to quality
  header.querySelector("button").click();
  out.byTime = visible();
  header = table.querySelectorAll("th")[7];  // Valid FLOPS: descending first, then ascending
  header.querySelector("button").click(); header.querySelector("button").click();
  out.byValidFlops = visible();
  var select = document.querySelector('select[data-filter="accelerator"]');
  select.value = "NVIDIA A100-SXM4-80GB"; select.dispatchEvent(new Event("change"));
  out.filtered = visible();
  out.shown = document.getElementById("shown").textContent;
  out.charts = Array.prototype.map.call(document.querySelectorAll("svg"), function (svg) {
    var texts = Array.prototype.map.call(svg.querySelectorAll("text"),
                                         function (t) { return t.textContent; });
    return [svg.dataset.xlabel, svg.dataset.ylabel, texts.indexOf(svg.dataset.xlabel) >= 0,
            texts.indexOf(svg.dataset.ylabel) >= 0, svg.getBoundingClientRect().width];
  });
  var pre = document.createElement("pre"); pre.id = "measured";
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
})();
</script>
"""


def _chromium() -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium): browser test skipped")
    return browser


def _measure(browser: str, page: Path, width: int, profile: Path) -> dict:
    """The page opened at `width` px with the measuring script after the page's own."""
    copy = page.with_name(f"measure-{width}.html")
    copy.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    flags = ["--headless", "--disable-gpu", "--no-sandbox", f"--window-size={width},900",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}",
             "--virtual-time-budget=5000", "--dump-dom"]  # fmt: skip
    done = subprocess.run([browser, *flags, copy.as_uri()], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    found = re.search(r'<pre id="measured">(.*?)</pre>', done.stdout, re.DOTALL)
    assert found, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))


def _labels(rows: list) -> list[str]:
    return [label.removesuffix(" (published 2020)") for label, *_ in rows]


@pytest.mark.parametrize("width", [1280, 400])
def test_in_a_browser_columns_sorting_filtering_and_charts(reported, tmp_path, width):
    records, pages = reported
    measured = _measure(_chromium(), pages / "index.html", width, tmp_path / "profile")
    for header, inner, word in measured["columns"]:
        assert inner >= word - 0.5, (header, inner, word)
    scroll, client = measured["scroll"]
    assert (scroll > client) == (width == 400)  # a phone scrolls the table; 1280 px holds it
    ranking = _ranking(records)
    by_time = sorted(ranking.submissions, key=lambda s: s.time_to_quality_s)
    assert _labels(measured["byTime"]) == [s.label for s in by_time]
    assert _labels(measured["byValidFlops"]) == [s.label for s in reversed(ranking.submissions)]
    a100 = [s.label for s in reversed(ranking.submissions)
            if s.system.get("accelerator") == "NVIDIA A100-SXM4-80GB"]  # fmt: skip
    assert _labels(measured["filtered"]) == a100 and len(a100) == 10
    assert {row[1] for row in measured["filtered"]} == {"NVIDIA A100-SXM4-80GB"}
    assert measured["shown"] == f"10 of {len(ranking.submissions)} rows shown"
    assert len(measured["charts"]) == 3
    for xlabel, ylabel, x_drawn, y_drawn, drawn_width in measured["charts"]:
        assert x_drawn and y_drawn and drawn_width > 300, (xlabel, ylabel)
        assert re.search(r"\(.+\)", xlabel) and re.search(r"\(.+\)", ylabel)  # a unit each
