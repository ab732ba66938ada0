"""Instances' run directories as a throughput record reads them: an MLPerf log holding only
run_start and run_stop, and each instance's member note (shared by the window tests)."""

import json
from pathlib import Path


def member_notes(parent: Path, windows: list[tuple[float, float]], hosts: list[str]) -> list:
    """Instance i: PARENT/instance-i/run/mlperf.log timed `windows[i]`, run on `hosts[i]`;
    its member note (as the launcher writes it), returned."""
    notes = []
    for index, ((start, stop), host) in enumerate(zip(windows, hosts, strict=True)):
        run_dir = parent / f"instance-{index}" / "run"
        run_dir.mkdir(parents=True)
        lines = [
            {"key": "run_start", "time_ms": start * 1000, "metadata": {}},
            {"key": "run_stop", "time_ms": stop * 1000, "metadata": {"status": "success"}},
        ]
        (run_dir / "mlperf.log").write_text("".join(f":::MLLOG {json.dumps(x)}\n" for x in lines))
        notes.append({"index": index, "seed": index, "run_dir": f"instance-{index}/run",
                      "exit_code": 0, "ended": "exited 0", "hosts": [host]})  # fmt: skip
    return notes
