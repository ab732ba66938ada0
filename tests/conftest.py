import copy
import json
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hpcai500_2020_google_tpuv3.json"


@pytest.fixture
def published_record() -> dict:
    """The Google TPU v3 entry of the 2020 ranking: a valid, rankable IC record."""
    return copy.deepcopy(json.loads(EXAMPLE.read_text()))


def set_result(record: dict, *, seconds: float, quality: float) -> dict:
    """Change a record's time-to-quality and quality, keeping it consistent."""
    record["quality"].update(
        achieved=quality,
        final=quality,
        time_to_quality_s=seconds,
        reached_target=quality >= record["quality"]["target"],
    )
    record["quality"]["curve"][-1].update(elapsed_s=seconds, value=quality)
    record["timeline"]["run_stop"] = seconds
    record["timeline"]["segments"] = [{"start": 0.0, "stop": seconds}]
    return record
