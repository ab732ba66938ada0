"""Meter-log reading stays linear in time and flat in memory: junk lines (two fields that are
not a reading, as a corrupted export gives) and valid readings at two sizes 10x apart, each
read by `read_meter_log` in a fresh process, against the peer measured in the same run: a bare
pass over the same file's lines (the least any reader does).

Reports seconds, peak resident memory and the ratio to the bare pass for each file, and the
time ratio between the two sizes (linear: ~10x). JSON after the table.

    python benchmarks/meter_log_scale.py [--megabytes 200]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hpcai500_tf.cluster.machine import cpu_facts

ROOT = Path(__file__).resolve().parents[1]

READ = """
import resource, sys, time
sys.path.insert(0, {root!r})
from hpcai500_tf.energy.meter_log import read_meter_log
from hpcai500_tf.errors import UserError
start = time.perf_counter()
if sys.argv[2] == "bare":
    with open(sys.argv[1], "rb") as handle:
        count = sum(1 for _ in handle)
else:
    try:
        count = len(read_meter_log(sys.argv[1])[0])
    except UserError:
        count = 0
seconds = time.perf_counter() - start
print(seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, count)
"""


def write_log(path: Path, megabytes: float, junk: bool) -> None:
    """A header, then lines of ~30 bytes until the size: junk pairs or 1 Hz readings."""
    target = int(megabytes * (1 << 20))
    with path.open("w") as handle:
        handle.write("timestamp,watts\n")
        written, index = 0, 0
        while written < target:
            block = []
            for _ in range(10_000):
                index += 1
                if junk:
                    block.append(f"x{index:x}q,{index * 7919 % 99991:x}z\n")
                else:
                    block.append(f"{1764451200 + index},{300 + index % 50}.5\n")
            text = "".join(block)
            handle.write(text)
            written += len(text)


def measure(path: Path, how: str) -> dict:
    script = READ.format(root=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", script, str(path), how], capture_output=True, text=True, check=True
    ).stdout.split()
    return {"seconds": float(out[0]), "peak_rss_mb": int(out[1]) / 1024, "items": int(out[2])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=200.0, help="the larger files' size")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for kind in ("junk", "readings"):
            for size in (args.megabytes / 10, args.megabytes):
                path = Path(scratch) / f"{kind}-{size:g}.log"
                write_log(path, size, junk=kind == "junk")
                bare, read = measure(path, "bare"), measure(path, "read")
                rows.append(
                    {
                        "file": kind,
                        "megabytes": round(os.path.getsize(path) / (1 << 20), 1),
                        "read_s": read["seconds"],
                        "bare_pass_s": bare["seconds"],
                        "ratio_to_bare_pass": read["seconds"] / bare["seconds"],
                        "peak_rss_mb": read["peak_rss_mb"],
                        "readings": read["items"],
                    }
                )
                path.unlink()
    print(f"CPU: {cpu_facts()['cpu_model']}")
    print(f"{'file':9} {'MB':>7} {'read s':>8} {'bare s':>7} {'x bare':>7} {'RSS MB':>7}")
    for row in rows:
        print(
            f"{row['file']:9} {row['megabytes']:7.1f} {row['read_s']:8.2f} "
            f"{row['bare_pass_s']:7.2f} {row['ratio_to_bare_pass']:7.1f} {row['peak_rss_mb']:7.0f}"
        )
    scaling = {
        kind: rows[2 * i + 1]["read_s"] / rows[2 * i]["read_s"]
        for i, kind in enumerate(("junk", "readings"))
    }
    print("time at 10x the size: " + ", ".join(f"{k} {v:.1f}x" for k, v in scaling.items()))
    print(json.dumps({"cpu": cpu_facts()["cpu_model"], "rows": rows, "scaling_10x": scaling}))


if __name__ == "__main__":
    main()
