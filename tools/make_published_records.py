"""Write the nine entries of the July 2020 HPC AI500 image-classification ranking (free level)
as records in examples/published_2020/, from the published table (SPEC section 3).

    python tools/make_published_records.py

The ranking gives, per entry: the submitter, Valid FLOPS, time (rounded, in minutes) and top-1
accuracy. It gives no hardware, software or FLOP count: each record's FLOPs are the analytical
ResNet-50 v1 count (3.86 GMACs forward x 2 x 3 = 23.16 GFLOPs per image) over 90 epochs of
ImageNet, the budget Google's on-target row implies; the published Valid FLOPS is kept in
`source.imported_from` and `config.published` so that tests can compare.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcai500_tf import config  # noqa: E402
from hpcai500_tf import record as record_io  # noqa: E402
from hpcai500_tf.results.record_builder import build_record  # noqa: E402

# rank, submitter, published Valid PFLOPS, time in minutes (as published), top-1 (%)
TABLE = [
    (1, "Fujitsu", 31.41, 1.2, 75.1),
    (2, "Google (1024 TPU v3)", 20.10, 2.2, 76.3),
    (3, "Sony", 10.02, 3.7, 75.0),
    (4, "Tencent", 6.44, 6.6, 76.0),
    (5, "Preferred Networks", 2.41, 15, 74.9),
    (6, "Berkeley", 1.95, 20, 75.4),
    (7, "Intel", 1.27, 28, 74.6),
    (8, "IBM", 0.75, 50, 75.0),
    (9, "Facebook", 0.70, 60, 76.3),
]
SOURCE = "BenchCouncil HPC AI500 V2.0 ranking, Image Classification, free level, July 2, 2020"
TARGET, EPOCHS, TRAIN_EXAMPLES = 0.763, 90, 1_281_167
PER_EXAMPLE = 3.86e9 * 2 * 3


def entry(rank: int, name: str, pflops: float, minutes: float, top1: float) -> dict:
    seconds, quality = minutes * 60, round(top1 / 100, 4)
    examples = EPOCHS * TRAIN_EXAMPLES
    point = {"epoch": EPOCHS, "elapsed_s": seconds, "examples": examples, "value": quality}
    return build_record(
        config.load_benchmark("image_classification"),
        preset="published",
        status="imported",
        tool="tools/make_published_records.py, from the published ranking table",
        tool_version="n/a",
        framework="not given by the ranking",
        imported_from=(
            f"{SOURCE}: rank {rank}, {name}, {top1} % top-1 in {minutes:g} min, "
            f"published {pflops:.2f} PFLOPS"
        ),
        layers={
            "L1": {"summary": name},
            "L2": {},
            "L3": {},
            "L4": {},
            "L5": {"framework": None},  # not given by the ranking
            "L6": {},
            "L7": {"model": "resnet50"},  # the version (v1 or v1.5) is not given
            "L8": {},
            "L9": {
                "dataset": "imagenet-1k",
                "quality_metric": "top1_accuracy",
                "target_quality": TARGET,
                "epochs": EPOCHS,
            },
        },
        config={"published": {"rank": rank, "valid_pflops": pflops, "source": SOURCE}},
        timeline={
            "init_start": 0.0,
            "run_start": 0.0,
            "run_stop": seconds,
            "segments": [{"start": 0.0, "stop": seconds}],
            "epochs": [],
        },
        curve=[point],
        metric="top1_accuracy",
        target=TARGET,
        measured=True,
        flops={
            "per_example_training": PER_EXAMPLE,
            "per_example_forward": PER_EXAMPLE / 3,
            "analytical_per_example_forward": PER_EXAMPLE / 3,
            "method": (
                "analytical: ResNet-50 (v1) 3.86 GMACs forward x 2 FLOPs per MAC x 3 (forward "
                f"+ backward), {EPOCHS} epochs of {TRAIN_EXAMPLES} images: the ranking gives no "
                "count; this is the budget its on-target rows imply"
            ),
            "basis": "analytical-resnet50-v1",
            "counted_op_types": [],
            "uncounted_op_types": [],
        },
        energy=record_io.energy_not_measured("the published ranking gives no power"),
        warnings=[
            f"time is the published {minutes:g} min, rounded as published; hardware, software "
            "and epochs are not given by the ranking (90 epochs is the problem's budget)"
        ],
        artifacts={},
    )


def main() -> None:
    out = ROOT / "examples" / "published_2020"
    out.mkdir(parents=True, exist_ok=True)
    for row in TABLE:
        slug = row[1].split(" (")[0].lower().replace(" ", "_")
        path = out / f"{row[0]}_{slug}.json"
        record_io.save(path, entry(*row), overwrite=True)
        print(path.relative_to(ROOT))


if __name__ == "__main__":
    main()
