import copy
import json
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "published_2020" / "2_google.json"


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


@pytest.fixture(scope="session")
def tf_tiny(tmp_path_factory):
    """A finished TensorFlow run of the tiny image-classification preset: (path, record)."""
    from hpcai500_tf import record
    from hpcai500_tf.cli import main

    out = tmp_path_factory.mktemp("tf")
    assert main(["train", "image_classification", "--preset", "tiny", "--out", str(out)]) == 0
    (path,) = out.glob("*/record.json")
    return path, record.load(path)


@pytest.fixture
def torch_installed():
    """PyTorch, or a skip; CI sets HPCAI500_REQUIRE_TORCH=1 so that a missing torch fails."""
    import os

    if os.environ.get("HPCAI500_REQUIRE_TORCH") == "1":
        import torch  # noqa: F401  (an ImportError fails the test)
    else:
        pytest.importorskip("torch", reason="PyTorch is optional: pip install -e '.[torch]'")
