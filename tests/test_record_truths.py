"""Scores that tell no more than the record holds: no Valid FLOPS per watt from some workers'
power where the others' was not gathered; one figure, recomputed, for how near the 2020
ranking's convention brings back its published rows."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcai500_tf import config, record
from hpcai500_tf.energy import sampler as power
from hpcai500_tf.report.console import score_table
from hpcai500_tf.report.pages import _score_section
from hpcai500_tf.results import scoring
from hpcai500_tf.run import energy, lifecycle
from hpcai500_tf.run.progress import Progress

ROOT = Path(__file__).resolve().parents[1]


def _board(worker: int, joules: float) -> dict:
    """A GPU board's measurement over the 10 s timed run of a worker."""
    return {
        "name": f"nvml:gpu{worker}", "part": power.GPU, "kind": "power", "method": "test",
        "worker": worker, "host": "h", "uuid": f"GPU-{worker}", "joules": joules,
        "covered_s": 10.0, "samples": 100, "sample_hz": 10.0, "failed_reads": 0,
        "first_error": None, "counter_faults": 0,
    }  # fmt: skip


def _energy(workers: int, collective) -> dict:
    """The energy block the chief of a completed run of `workers` writes, its own board at
    300 W and each other's at 200 W, gathered by `collective` (a row per worker)."""
    progress = Progress("x", segments=[{"start": 0.0, "stop": 10.0}])
    progress.energy = [[_board(0, 3000.0)]]
    one = SimpleNamespace(workers=workers, progress=progress, warnings=[], finished=False,
                          trainer=SimpleNamespace(gather_rows=collective))  # fmt: skip
    others, notes, nodes = energy.gather_energy(one, lifecycle.Outcome(status="completed"))
    block, _ = energy.energy_result(progress, notes, 10.0, None, others, nodes)
    return block


def _gathered(row: list[float]) -> list[list[float]]:
    return [row] + [power.worker_vector([_board(rank, 2000.0)]) for rank in (1, 2, 3)]


def _failed(row: list[float]):
    raise RuntimeError("the collective timed out")


@pytest.fixture(scope="module")
def ic():
    return config.load_benchmark("image_classification")


def test_a_multi_worker_run_whose_energy_gather_failed_scores_no_valid_flops_per_watt(
    published_record, ic
):
    published_record["energy"] = _energy(4, _failed)
    rec = record.validate(published_record)
    assert rec["energy"]["measured"] and rec["energy"]["average_watts"] == pytest.approx(300.0)
    score = scoring.score(rec, ic)
    assert score.valid_flops_per_watt is None and score.average_watts is None
    assert score.energy_note == (
        "not measured in full: workers 1-3: energy not gathered (the collective gathering them "
        "failed: RuntimeError); no Valid FLOPS per watt (the 300 W measured, 1 GPU board only, "
        "leaves them out)"
    )
    table = score_table("r.json", rec, score)
    rows = dict(zip(table.columns[0]._cells, table.columns[1]._cells, strict=True))
    assert "Valid FLOPS per watt" not in rows and "Average power" not in rows
    assert rows["Energy"] == score.energy_note
    page = _score_section(rec)
    assert "FLOPS/W" not in page and "not measured: None" not in page
    assert page.count("not measured in full: workers 1-3: energy not gathered") == 2


def test_the_same_run_gathered_scores_per_watt_over_every_worker(published_record, ic):
    published_record["energy"] = _energy(4, _gathered)
    score = scoring.score(record.validate(published_record), ic)
    assert score.average_watts == pytest.approx(300.0 + 3 * 200.0)
    assert score.valid_flops_per_watt == pytest.approx(score.valid_flops / 900.0)
    assert score.energy_note.startswith("measured: 4 GPU boards only")


def test_the_2020_fit_is_one_figure_the_published_records_give():
    """The largest distance of the eight rows n = 10 brings back (all but Facebook's), as
    `score --convention published-2020` gives it, is the figure the config and the docs
    state: the smallest hundredth of a per cent at or above it."""
    ic = config.load_benchmark("image_classification")
    distances = {}
    for path in sorted((ROOT / "examples/published_2020").glob("*.json")):
        rec = record.load(path)
        ours = scoring.score(rec, ic, convention="published-2020").valid_flops
        distances[path.stem] = abs(ours / (rec["config"]["published"]["valid_pflops"] * 1e15) - 1)
    del distances["9_facebook"]  # its "60 min" is a round figure (docs/scoring.md)
    farthest = max(distances, key=distances.get)
    assert farthest == "5_preferred_networks"
    stated = set()
    for name in ("configs/image_classification.toml", "docs/scoring.md"):
        text = (ROOT / name).read_text()
        stated |= set(re.findall(r"rows\s+(?:come\s+back\s+)?within\s+(\d+\.\d+) %", text))
    (figure,) = stated
    assert distances[farthest] * 100 <= float(figure) < distances[farthest] * 100 + 0.01
