"""Node power meter logs supplied by the user (a PDU export, a loop over
`ipmitool dcmi power reading`, a wall meter).

The format: a text file of `timestamp,power` lines.
- `timestamp`: Unix seconds (e.g. 1764451200.25) or ISO 8601 with a timezone
  (e.g. 2026-11-29T20:50:05.250+00:00 or ...Z).
- `power`: the node's power, in watts unless a header says otherwise.
- An optional header as the first line, e.g. `timestamp,watts`; its second column names the
  unit: W/watts, kW/kilowatts or mW/milliwatts. Lines starting with `#` and blank lines are
  ignored; whitespace around fields is ignored; a semicolon or a tab may separate the fields.

Lines that cannot be read (or read beyond a gigawatt, or past the year 5138) are skipped,
out-of-order lines are sorted, repeated timestamps keep their first reading; every such
repair becomes a warning in the record.
"""

from __future__ import annotations

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


# A reading's shape: two fields, the first a number or an ISO 8601 time, the second a number
# (checked by conversion after): a junk line is refused by one match, without exceptions.
_READING = re.compile(
    r"\s*([0-9+.-][0-9.eE+-]*|\d{4}-\d\d-\d\d[T ][0-9:.+Z-]+)\s*[,;\t]\s*"
    r"([0-9+.-][0-9.eE+-]*|[+-]?(?:nan|inf(?:inity)?))\s*",
    re.IGNORECASE,
)
SHOWN_BAD_LINES = 5


def read_meter_log(path: str | Path) -> tuple[list[tuple[float, float]], list[str]]:
    """(time-ordered (unix seconds, watts) readings, warnings). Raises UserError when the file
    cannot be read or holds no usable reading. Read line by line: time and memory linear in
    the usable readings, a few microseconds a junk line."""
    from hpcai500_tf.files import open_regular_file  # a FIFO or device is refused, not read

    path = Path(path)
    factor, readings, bad, bad_count = 1.0, [], [], 0
    first = True
    with open_regular_file(path, "meter log") as handle:
        try:
            for number, raw in enumerate(handle, start=1):
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError:
                    raise UserError(f"{path}: not UTF-8 text; a meter log is") from None
                if not line or line.startswith("#"):
                    continue
                if first:
                    first = False
                    fields = [f.strip() for f in _SPLIT.split(line)]
                    if len(fields) == 2 and not re.match(r"^[\d.+-]", fields[0]):
                        factor = _unit_factor(fields[1], path)
                        continue
                reading = _reading(line, factor)
                if reading is None:
                    bad_count += 1
                    if len(bad) < SHOWN_BAD_LINES:
                        bad.append(number)
                    continue
                readings.append(reading)
        except OSError as error:
            raise UserError(f"{path}: cannot read meter log ({error.strerror or error})") from None
    warnings = []
    if bad_count:
        shown = ", ".join(map(str, bad)) + (", ..." if bad_count > len(bad) else "")
        warnings.append(f"{path}: {bad_count} unreadable line(s) skipped (line {shown})")
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


MAX_WATTS = 1e9  # a gigawatt: above any machine's draw (and what keeps joules finite)
MAX_SECONDS = 1e11  # the year 5138: a timestamp past it is a misread line


def _reading(line: str, factor: float) -> tuple[float, float] | None:
    """(unix seconds, watts) of one line; None where it is not a finite, non-negative one,
    or beyond MAX_WATTS or MAX_SECONDS."""
    match = _READING.fullmatch(line)
    if match is None:
        return None
    try:
        stamp, watts = _timestamp(match.group(1)), float(match.group(2)) * factor
    except ValueError:
        return None
    if not (abs(stamp) < MAX_SECONDS and 0 <= watts <= MAX_WATTS):  # NaN fails both
        return None
    return stamp, watts
