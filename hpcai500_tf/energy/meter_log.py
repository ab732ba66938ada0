"""Node power meter logs supplied by the user (a PDU export, a loop over
`ipmitool dcmi power reading`, a wall meter).

The format: a text file of `timestamp,power` lines.
- `timestamp`: Unix seconds (e.g. 1764451200.25) or ISO 8601 with a timezone
  (e.g. 2026-11-29T20:50:05.250+00:00 or ...Z).
- `power`: the node's power, in watts unless a header says otherwise.
- An optional header as the first line, e.g. `timestamp,watts`; its second column names the
  unit: W/watts, kW/kilowatts or mW/milliwatts. Lines starting with `#` and blank lines are
  ignored; whitespace around fields is ignored; a semicolon or a tab may separate the fields.

Lines that cannot be read are skipped, out-of-order lines are sorted, repeated timestamps keep
their first reading; every such repair becomes a warning in the record.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from pathlib import Path

from hpcai500_tf.errors import UserError

_UNITS = {"w": 1.0, "watt": 1.0, "watts": 1.0, "kw": 1e3, "kilowatts": 1e3, "mw": 1e-3}
_UNITS |= {"milliwatts": 1e-3, "power_w": 1.0, "power": 1.0}
_SPLIT = re.compile(r"[,;\t]")


def _timestamp(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        raise ValueError("an ISO timestamp without a timezone")
    return stamp.timestamp()


def _unit_factor(header: str, path: Path) -> float:
    name = header.strip().lower().strip("()[] ")
    name = name.split("(")[-1].strip(") ") if "(" in name else name
    if name not in _UNITS:
        raise UserError(
            f"{path}: unknown power unit '{header.strip()}' in the header (expected W, kW or mW)"
        )
    return _UNITS[name]


def read_meter_log(path: str | Path) -> tuple[list[tuple[float, float]], list[str]]:
    """(time-ordered (unix seconds, watts) readings, warnings). Raises UserError when the file
    cannot be read or holds no usable reading."""
    from hpcai500_tf.record import read_regular_file  # a FIFO or device is refused, not read

    path = Path(path)
    text = read_regular_file(path, "meter log")
    factor, readings, bad = 1.0, [], []
    first = True
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in _SPLIT.split(line)]
        if first:
            first = False
            if len(fields) == 2 and not re.match(r"^[\d.+-]", fields[0]):
                factor = _unit_factor(fields[1], path)
                continue
        try:
            if len(fields) != 2:
                raise ValueError("not two fields")
            stamp, watts = _timestamp(fields[0]), float(fields[1]) * factor
            if not (math.isfinite(stamp) and math.isfinite(watts)) or watts < 0:
                raise ValueError("not a finite, non-negative reading")
        except ValueError:
            bad.append(number)
            continue
        readings.append((stamp, watts))
    warnings = []
    if bad:
        shown = ", ".join(str(n) for n in bad[:5]) + (", ..." if len(bad) > 5 else "")
        warnings.append(f"{path}: {len(bad)} unreadable line(s) skipped (line {shown})")
    out_of_order = sum(1 for a, b in zip(readings, readings[1:], strict=False) if b[0] < a[0])
    if out_of_order:
        warnings.append(f"{path}: {out_of_order} reading(s) out of time order (sorted)")
        readings.sort(key=lambda reading: reading[0])
    unique = [r for i, r in enumerate(readings) if i == 0 or r[0] != readings[i - 1][0]]
    if len(unique) < len(readings):
        warnings.append(
            f"{path}: {len(readings) - len(unique)} repeated timestamp(s) (first reading kept)"
        )
    if len(unique) < 2:
        raise UserError(f"{path}: fewer than two usable readings in the meter log")
    return unique, warnings
