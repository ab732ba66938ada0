"""Facts about a data directory's files, remembered while the files stay the same.

A split's files are fingerprinted by their names and sizes; facts found by reading them (record
counts, sampled labels) are kept in DATA_DIR/.hpcai500-counts.json under the split's name with
that fingerprint, and used only while it matches. A read-only data directory keeps them in the
user cache instead ($HPCAI500_CACHE/hpcai500-tf or ~/.cache/hpcai500-tf, keyed by the
directory's absolute path); when neither can be written, they are found again next time.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from hpcai500_tf import record as record_io

CACHE_FILE = ".hpcai500-counts.json"
FINGERPRINT_METHOD = "sha256 over the JSON list of the sorted [file name, size in bytes] pairs"


def cache_dir() -> Path:
    """The user cache: $HPCAI500_CACHE or $XDG_CACHE_HOME, else ~/.cache, + hpcai500-tf."""
    base = os.environ.get("HPCAI500_CACHE") or os.environ.get("XDG_CACHE_HOME")
    return Path(base) / "hpcai500-tf" if base else Path.home() / ".cache" / "hpcai500-tf"


def fingerprint(paths: list[Path]) -> str:
    pairs = sorted([p.name, p.stat().st_size] for p in paths)
    return hashlib.sha256(json.dumps(pairs).encode()).hexdigest()


def cache_files(data_dir: str | Path) -> list[Path]:
    """Where facts about `data_dir` are kept, in the order they are tried."""
    data_dir = Path(data_dir).resolve()
    key = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]
    return [data_dir / CACHE_FILE, cache_dir() / "data-facts" / f"{key}.json"]


def _read(path: Path) -> dict:
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) and isinstance(stored.get("splits"), dict) else {}


def load(data_dir: str | Path, split: str, fingerprint: str) -> dict | None:
    """The facts kept for `split` if its files still have `fingerprint`."""
    for path in cache_files(data_dir):
        facts = _read(path).get("splits", {}).get(split)
        if isinstance(facts, dict) and facts.get("fingerprint") == fingerprint:
            return facts
    return None


def store(data_dir: str | Path, split: str, facts: dict) -> Path | None:
    """Keep `facts` (with their "fingerprint") for `split`; where they went, or None."""
    for path in cache_files(data_dir):
        stored = _read(path) or {"data_dir": str(Path(data_dir).resolve()), "splits": {}}
        stored["splits"][split] = facts
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            record_io.write_atomic(path, stored, overwrite=True)
            return path
        except OSError:
            continue
    return None
