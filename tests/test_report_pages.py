"""`hpcai500-tf report`: the HTML page of a run, the ranking page, bad input, and a page as a
headless browser shows, screenshots and prints it."""

import copy
import functools
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hpcai500_tf import record as record_io
from hpcai500_tf.cli import main
from hpcai500_tf.report import pages
from hpcai500_tf.report.console import LAYER_NAMES
from hpcai500_tf.report.html_parts import POLICY

from .conftest import EXAMPLE

START = 1_767_000_000.0  # the runs' clock (Unix seconds)
# What would fetch something: a remote src/href, CSS url() or @import, a script from a file,
# a stylesheet link or an image file (the ranking page's one inline script fetches nothing).
ASSET = re.compile(
    r"""(?:(?:src|href|action)\s*=|url\()\s*["']?\s*(?:https?:)?//|@import|<script[^>]*\ssrc|<link|<img""",
    re.IGNORECASE,
)


def full_record(system: str = "Test cluster (2 x CPU)", seconds: float = 100.0) -> dict:
    """A completed run of four epochs with a quality curve, measured energy, all nine layers
    and a FLOP count: the published Google entry, varied."""
    record = copy.deepcopy(json.loads(EXAMPLE.read_text()))
    record.update(status="completed", preset="tiny")
    record["source"].update(tool="hpcai500-tf", framework="tensorflow", imported_from=None)
    record["layers"]["L1"] = {"summary": system, "cpu_model": "Test CPU", "memory_bytes": 8 << 30}
    record["layers"]["L5"] = {"framework": "tensorflow", "framework_version": "2.21.0"}
    record["layers"]["L8"] = {"seed": 1, "optimizer": "lars", "global_batch": 256}
    per_epoch = seconds / 4
    record["timeline"] = {
        "init_start": START - 5,
        "run_start": START,
        "run_stop": START + seconds,
        "segments": [{"start": START, "stop": START + seconds}],
        "epochs": [
            {"epoch": i, "elapsed_s": per_epoch * i, "examples": 1000 * i, "seconds": per_epoch}
            for i in range(1, 5)
        ],
    }
    curve = [
        {"epoch": i, "elapsed_s": per_epoch * i, "examples": 1000 * i, "value": value}
        for i, value in enumerate((0.5, 0.7, 0.77, 0.78), start=1)
    ]
    record["quality"].update(
        record_io.quality_result(curve, record["quality"]["target"], True), curve=curve
    )
    record["flops"].update(
        per_example_training=1e9,
        total=1e9 * 4000,
        method="TensorFlow registered op statistics over the train step",
        basis="tensorflow-profiler",
        counted_op_types=["Conv2D", "MatMul"],
        uncounted_op_types=["FusedBatchNormV3"],
    )
    source = {"name": "rapl:package-0", "part": "CPU package", "method": "RAPL"}
    measured = {"joules": 250.0 * seconds, "average_watts": 250.0, "coverage": 0.99}
    record["energy"] = {
        **measured,
        "measured": True,
        "reason": None,
        "interval_s": seconds,
        "scope": "1 CPU package only",
        "sample_hz": 1.0,
        "parts_measured": ["1 CPU package"],
        "parts_not_measured": ["the rest of the node"],
        "quality_flags": [],
        "sources": [source | measured],
    }
    record["warnings"] = ["a warning with <script>alert(1)</script> in it"]
    return record_io.validate(record)


def throughput_only(record: dict) -> dict:
    """The same run on random data: quality not measured, nothing to score."""
    record = copy.deepcopy(record)
    record["quality"].update(record_io.quality_result([], record["quality"]["target"], False))
    record["quality"]["curve"] = []
    record["flops"]["total"] = None
    return record_io.validate(record)


def write_power_samples(run_dir: Path, seconds: int = 100) -> None:
    """A counter source (joules, 250 W) and a power source (watts), a reading a second."""
    lines = ["worker,source,unix_s,value,unit"]
    for i in range(seconds + 1):
        lines.append(f"0,rapl:package-0,{START + i:.4f},{250.0 * i:.6f},J")
        lines.append(f"0,gpu<0>,{START + i:.4f},{100 + i % 7:.6f},W")
    (run_dir / "power-samples.csv").write_text("\n".join(lines) + "\n")


def make_run(tmp_path: Path, name: str, record: dict | None, power: bool = True) -> Path:
    run_dir = tmp_path / name
    run_dir.mkdir()
    if record is not None:
        record_io.save(run_dir / "record.json", record)
    if power:
        write_power_samples(run_dir)
    return run_dir


def report(tmp_path: Path, *runs: Path) -> dict[str, str]:
    """Run the command; the pages it wrote, by file name."""
    out = tmp_path / "report"
    assert main(["report", *map(str, runs), "--out", str(out)]) == 0
    return {path.name: path.read_text() for path in out.iterdir()}


def text_of(page: str) -> str:
    """The page's visible text, roughly: tags out, entities in."""
    import html

    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def test_a_full_run_page_holds_score_charts_and_layers_in_itself(tmp_path, capsys):
    run_dir = make_run(tmp_path, "run-a", full_record())
    written = report(tmp_path, run_dir)
    assert list(written) == ["run-a.html"]
    assert capsys.readouterr().out.strip().endswith("run-a.html")
    page = written["run-a.html"]
    text = text_of(page)
    assert "Valid FLOPS" in text and "GFLOPS" in text
    for name in LAYER_NAMES.values():
        assert name in text
    assert "Test cluster (2 x CPU)" in text and "FusedBatchNormV3" in text
    assert "1 CPU package only" in text and "FLOPS/W" in text
    assert page.count("<svg") == 3  # quality, throughput per epoch, power
    assert text.count("missing:") == 1 and "missing: per-step throughput" in text
    assert not ASSET.search(page), ASSET.search(page)
    assert "<script>alert(1)" not in page and "gpu&lt;0&gt;" in page


def test_a_throughput_only_run_without_power_samples_says_what_is_missing(tmp_path):
    run_dir = make_run(tmp_path, "random-data", throughput_only(full_record()), power=False)
    text = text_of(report(tmp_path, run_dir)["random-data.html"])
    assert "not scored: cannot score a throughput-only run" in text
    assert "missing: quality curve: a throughput-only run" in text
    assert "missing: power samples: no power-samples.csv" in text
    assert "missing: per-step throughput (TensorBoard events): no tensorboard/" in text


def test_a_diverged_run_says_why_it_is_not_scored(tmp_path):
    record = full_record()
    record["status"] = "diverged"
    run_dir = make_run(tmp_path, "diverged", record_io.validate(record))
    text = text_of(report(tmp_path, run_dir)["diverged.html"])
    assert "not scored: cannot score a run whose status is 'diverged'" in text


def test_a_directory_without_a_record_and_a_damaged_power_file_still_render(tmp_path):
    run_dir = make_run(tmp_path, "crashed", None)
    samples = run_dir / "power-samples.csv"
    samples.write_text(samples.read_text()[:-20] + "\nnot,a,line\n")  # cut off mid-line
    page = report(tmp_path, run_dir)["crashed.html"]
    text = text_of(page)
    assert "missing: record: no record.json in" in text
    assert "malformed line(s) of power-samples.csv left out" in text
    assert page.count("<svg") == 1  # the power chart from what could be read


def test_a_directory_that_is_no_run_is_refused(tmp_path, capsys):
    """A folder holding files but none a run writes (`report /etc`) was a page saying only
    what it lacked, exit 0."""
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"\xff\xd8")
    assert main(["report", str(other), "--out", str(tmp_path / "report")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(f"{other}: not a run directory (none of the files a run writes is in it)")
    assert not (tmp_path / "report").exists()


def test_a_record_file_works_as_well_as_its_directory(tmp_path):
    run_dir = make_run(tmp_path, "run-a", full_record())
    page = report(tmp_path, run_dir / "record.json")["run-a.html"]
    assert "Valid FLOPS" in text_of(page) and page.count("<svg") == 3  # with the power chart
    alone = text_of(report(tmp_path / "run-a", EXAMPLE)["2_google.html"])
    assert "missing: power samples: a record file given alone" in alone


def test_several_runs_give_a_ranking_page_linking_each_run(tmp_path):
    fast = make_run(tmp_path, "fast", full_record("Fast machine", seconds=50.0))
    slow = make_run(tmp_path, "slow", full_record("Slow machine", seconds=200.0))
    random = make_run(tmp_path, "random", throughput_only(full_record("Random data")))
    empty = make_run(tmp_path, "empty", None, power=False)
    written = report(tmp_path, fast, slow, random, empty)
    systems = sorted(name for name in written if name.startswith("system-"))
    assert sorted(set(written) - set(systems)) == [
        "empty.html", "fast.html", "index.html", "random.html", "slow.html"
    ]  # fmt: skip
    assert systems == [f"system-image_classification-stated-{name}-machine-tensorflow-2.21.0.html"
                       for name in ("Fast", "Slow")]  # fmt: skip
    index = written["index.html"]
    for name in ("fast", "slow", "random", "empty"):
        assert f'href="{name}.html"' in index
    assert (
        'href="index.html"' in written["fast.html"] and 'href="index.html"' in written[systems[0]]
    )
    ranked = re.findall(r'<tr [^>]*><td data-sort="(\d)" class="number">\d</td>'
                        r'<td [^>]*><a href="system-[\w.-]+?-(\w+)-machine', index)  # fmt: skip
    assert ranked == [("1", "Fast"), ("2", "Slow")]
    refused = text_of(index.split('id="refused"')[1])
    assert "quality not measured" in refused and "no record.json" in refused
    assert not ASSET.search(index)
    assert index.count("<script>") == 1 and POLICY in index and POLICY in written[systems[0]]


def test_system_facts_of_any_json_type_rank_and_a_page_that_fails_leaves_no_report(
    tmp_path, monkeypatch
):
    # An imported sidecar's L1 may hold a list or text where a ranking shows a model and counts.
    odd = full_record("Odd machine")
    odd["layers"]["L1"].update(accelerator_model=["H100", "H100", "A100"], accelerator_count="8",
                               nodes=True)  # fmt: skip
    runs = [make_run(tmp_path, "odd", odd), make_run(tmp_path, "plain", full_record())]
    written = report(tmp_path, *runs)
    assert "A100, H100" in text_of(written["index.html"])

    # A page that cannot be rendered stops the report before any page is written.
    def broken(*args):
        raise RuntimeError("a page failed")

    monkeypatch.setattr(pages, "index_page", broken)
    with pytest.raises(RuntimeError, match="a page failed"):
        main(["report", *map(str, runs), "--out", str(tmp_path / "again")])
    assert not (tmp_path / "again").exists()


@pytest.mark.parametrize("taken", ["file", "non-empty"])
def test_an_output_that_is_a_file_or_not_empty_is_refused_in_one_line(tmp_path, capsys, taken):
    run_dir = make_run(tmp_path, "run-a", full_record())
    out = tmp_path / "out"
    if taken == "file":
        out.write_text("mine")
    else:
        out.mkdir()
        (out / "run-a.html").write_text("mine")
    assert main(["report", str(run_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hpcai500-tf: error: --out")
    assert ("not a directory" if taken == "file" else "not empty") in err
    assert (out if taken == "file" else out / "run-a.html").read_text() == "mine"


def test_an_argument_that_is_no_run_is_named_in_one_line(tmp_path, capsys):
    junk = tmp_path / "notes.txt"
    junk.write_text("hello")
    for argument in (junk, tmp_path / "nowhere"):
        out = tmp_path / "out"
        assert main(["report", str(argument), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(argument) in err
        assert not out.exists()


def test_tensorboard_steps_are_charted_and_a_cut_off_file_is_noted(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard package comes with the cpu extra")
    import tensorflow as tf

    run_dir = make_run(tmp_path, "run-a", full_record())
    writer = tf.summary.create_file_writer(str(run_dir / "tensorboard"))
    with writer.as_default():
        for step in range(1, 41):
            tf.summary.scalar("train/examples_per_second", 100.0 + step, step=step)
            tf.summary.scalar("train/loss", 1.0 / step, step=step)
    writer.close()
    page = report(tmp_path, run_dir)["run-a.html"]
    assert "from TensorBoard (40 values)" in page and page.count("<svg") == 4
    (event_file,) = (run_dir / "tensorboard").glob("*tfevents*")
    event_file.write_bytes(event_file.read_bytes()[:-30])
    (run_dir / "tensorboard" / "events.out.tfevents.0.junk").write_bytes(b"\x01" * 40)
    text = text_of(report(tmp_path / "run-a", run_dir)["run-a.html"])
    assert "is cut off" in text and "events.out.tfevents.0.junk" in text
    assert "from TensorBoard (" in text  # the steps before the cut are still shown


def _record_offset(data: bytes, index: int) -> int:
    """Where record `index` (from 0) of an event file starts: each record is its 8-byte
    length, a 4-byte check, the data and another 4-byte check."""
    offset = 0
    for _ in range(index):
        offset += 16 + int.from_bytes(data[offset : offset + 8], "little")
    return offset


@pytest.mark.parametrize(("part", "at"), [("data", 12), ("length", 0)])
def test_a_damaged_event_record_keeps_the_steps_before_it(tmp_path, monkeypatch, part, at):
    """The project's own writer's events, one record damaged (a bit of its data, or its
    length): its checksum fails, the page shows the steps before it and says where."""
    pytest.importorskip("tensorboard", reason="the tensorboard package comes with the cpu extra")
    from hpcai500_tf.report import event_files
    from hpcai500_tf.report import tensorboard as writer

    monkeypatch.setattr(writer, "MAX_WRITES_PER_S", float("inf"))  # every step written
    run_dir = make_run(tmp_path, "run-a", full_record())
    view = writer.TensorBoardView(run_dir / "tensorboard")
    view.epoch_start(1, 1, 40)
    for step in range(1, 41):
        view.step(step, 1.0 / step, 0.1, 100.0 + step)
    view.close()
    (event_file,) = (run_dir / "tensorboard").glob("*tfevents*")
    records, damage = event_files.read_records(event_file)
    throughput = event_files.scalar_values(records, "train/examples_per_second")
    assert damage is None and throughput == {step: 100.0 + step for step in range(1, 41)}
    # Record 0 is the file's version; then loss, learning rate, throughput for each step.
    data = bytearray(event_file.read_bytes())
    data[_record_offset(data, 3 * 20) + at] ^= 0x01  # step 20's throughput
    event_file.write_bytes(bytes(data))
    records, damage = event_files.read_records(event_file)
    assert damage == "is damaged (record 61 fails its checksum)", part
    text = text_of(report(tmp_path, run_dir)["run-a.html"])
    assert "from TensorBoard (19 values)" in text and "record 61 fails its checksum" in text


def _chromium() -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium): browser test skipped")
    return browser


def _browse(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--disable-gpu", "--no-sandbox", "--window-size=1280,2000"]
    flags += ["--disable-dev-shm-usage", f"--user-data-dir={profile}"]
    return subprocess.run(
        [browser, *flags, *args], capture_output=True, text=True, timeout=120, check=True
    )


def test_a_headless_browser_shows_screenshots_and_prints_the_page(tmp_path):
    browser = _chromium()
    import matplotlib.image

    page = tmp_path / "report" / "run-a.html"
    report(tmp_path, make_run(tmp_path, "run-a", full_record()))
    browse = functools.partial(_browse, browser, tmp_path / "profile")
    text = text_of(browse("--dump-dom", page.as_uri()).stdout)
    assert "Valid FLOPS" in text and "GFLOPS" in text
    assert all(name in text for name in LAYER_NAMES.values())
    png, pdf = tmp_path / "page.png", tmp_path / "page.pdf"
    browse(f"--screenshot={png}", page.as_uri())
    pixels = matplotlib.image.imread(png)[..., :3]
    assert pixels.shape[:2] == (2000, 1280)
    assert pixels.std() > 0.02 and len({tuple(p) for p in pixels[::16, ::16].reshape(-1, 3)}) > 20
    browse("--no-pdf-header-footer", f"--print-to-pdf={pdf}", page.as_uri())
    printed = pdf.read_bytes()
    assert printed.startswith(b"%PDF") and len(printed) > 10_000
    assert b"/MediaBox [0 0 594.9" in printed  # A4: 210 x 297 mm, 595 x 842 points


def test_page_names_are_safe_and_unique():
    runs = [
        pages.RunFiles("a", name, None, None) for name in ("run 1", "run 1", "index", "../x", "")
    ]
    names = ["run-1.html", "run-1-2.html", "index-2.html", "x.html", "run.html"]
    assert pages.page_names(runs) == names
