"""ExtremeWeather (Racah et al., 2017) HDF5 files into tf.data, and a synthetic generator.

Layout, one file per year (`climo_YYYY.h5`):
- `images`: (N, 16, H, W) float, channels in CHANNELS order (768 x 1152 in the published data);
- `boxes`: (N, 15, 5) rows [ymin, xmin, ymax, xmax, class] in pixels, unused rows all -1;
- classes 0-3: CLASSES.

Samples are read one at a time (a year is 62 GB: a file is never loaded whole). Every file's
`boxes` are checked when the dataset is built (missing datasets, shapes, dtypes, boxes outside
the image, unknown classes: one line naming file and sample); each image is checked as it is
read (non-finite values stop the run naming file and sample: a bad sample never becomes a zero
image). Per-channel mean and standard deviation over the training files are computed once and
kept beside the data in `normalization.json`. `downsample` averages f x f pixel blocks and
scales the boxes with them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np

from hpcai500_tf import record as record_io
from hpcai500_tf.errors import UserError

CHANNELS = (
    "PRECT", "PS", "PSL", "QREFHT", "T200", "T500", "TMQ", "TREFHT",
    "TS", "U850", "UBOT", "V850", "VBOT", "Z100", "Z200", "ZBOT",
)  # fmt: skip
CLASSES = ("tropical_depression", "tropical_cyclone", "extratropical_cyclone", "atmospheric_river")
MAX_BOXES = 15
PUBLISHED_IMAGE_SHAPE = (768, 1152)  # height, width of the published files
STATS_FILE = "normalization.json"
_YEAR = re.compile(r"(\d{4})")


def _h5py():
    import h5py

    return h5py


def year_files(data_dir: str | Path, years: list[int]) -> list[Path]:
    """The files of `years` in `data_dir` (named with their year, e.g. climo_1979.h5)."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise UserError(f"{data_dir}: not a directory of ExtremeWeather .h5 files")
    by_year: dict[int, Path] = {}
    for path in sorted(data_dir.glob("*.h5")):
        match = _YEAR.search(path.stem)
        if match:
            by_year.setdefault(int(match.group(1)), path)
    missing = [year for year in years if year not in by_year]
    if missing:
        raise UserError(
            f"{data_dir}: no .h5 file for year(s) {', '.join(map(str, missing))} "
            f"(found: {', '.join(map(str, sorted(by_year))) or 'none'})"
        )
    return [by_year[year] for year in years]


def check_file(path: Path) -> tuple[int, int, int]:
    """(samples, height, width) of a valid file; UserError naming file and sample otherwise."""
    h5py = _h5py()
    try:
        handle = h5py.File(path, "r")
    except OSError as error:
        raise UserError(f"{path}: not a readable HDF5 file ({error})") from None
    with handle:
        for name in ("images", "boxes"):
            if name not in handle:
                raise UserError(f"{path}: no '{name}' dataset")
        images, boxes = handle["images"], handle["boxes"]
        if images.ndim != 4 or images.shape[1] != len(CHANNELS):
            raise UserError(f"{path}: 'images' must be (N, 16, H, W), got {images.shape}")
        if images.dtype.kind != "f":
            raise UserError(f"{path}: 'images' must hold floats, got {images.dtype}")
        count, _, height, width = images.shape
        if boxes.shape != (count, MAX_BOXES, 5):
            raise UserError(f"{path}: 'boxes' must be ({count}, 15, 5), got {boxes.shape}")
        if boxes.dtype.kind not in "fiu":
            raise UserError(f"{path}: 'boxes' must hold numbers, got {boxes.dtype}")
        try:
            rows = np.asarray(boxes[...], dtype=np.float64)
        except OSError as error:
            raise UserError(f"{path}: 'boxes' cannot be read ({error})") from None
    for index in range(count):
        problem = _box_problem(rows[index], height, width)
        if problem:
            raise UserError(f"{path}: sample {index}: {problem}")
    return count, height, width


def _box_problem(rows: np.ndarray, height: int, width: int) -> str | None:
    for row in rows:
        if np.all(row == -1):
            continue
        ymin, xmin, ymax, xmax, cls = row
        if not np.all(np.isfinite(row)):
            return f"box {row.tolist()} is not finite"
        if cls not in range(len(CLASSES)):
            return f"box class {cls:g} is unknown (0-{len(CLASSES) - 1})"
        if not (0 <= ymin < ymax <= height and 0 <= xmin < xmax <= width):
            return f"box {row[:4].tolist()} is empty or outside the {height}x{width} image"
    return None


def read_sample(handle, path: Path, index: int, downsample: int) -> tuple[np.ndarray, np.ndarray]:
    """One (H/f, W/f, 16) float32 image (channels last) and its (15, 5) boxes, scaled."""
    try:
        image = np.asarray(handle["images"][index], dtype=np.float32)
        boxes = np.asarray(handle["boxes"][index], dtype=np.float32)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: sample {index} cannot be read ({error})") from None
    if not np.all(np.isfinite(image)):
        raise UserError(f"{path}: sample {index}: the image holds NaN or infinite values")
    image = image.transpose(1, 2, 0)
    if downsample > 1:
        h, w, c = image.shape
        h, w = h // downsample * downsample, w // downsample * downsample
        image = image[:h, :w].reshape(h // downsample, downsample, w // downsample, downsample, c)
        image = image.mean(axis=(1, 3))
        used = boxes[:, 4] >= 0
        boxes[used, :4] /= downsample
    return image, boxes


def normalization(files: list[Path], data_dir: Path, samples_per_file: int = 64) -> dict:
    """Per-channel mean and std over (an even subsample of) the training files, computed once
    and kept in DATA_DIR/normalization.json keyed by the files' names and sizes."""
    key = hashlib.sha256(
        json.dumps([[p.name, p.stat().st_size] for p in files]).encode()
    ).hexdigest()[:16]
    stats_path = data_dir / STATS_FILE
    if stats_path.is_file():
        try:
            stored = json.loads(stats_path.read_text())
            if stored.get("key") == key:
                return stored
        except (json.JSONDecodeError, OSError):
            pass
    h5py = _h5py()
    total = np.zeros(len(CHANNELS))
    squares = np.zeros(len(CHANNELS))
    pixels = 0
    for path in files:
        with h5py.File(path, "r") as handle:
            count = handle["images"].shape[0]
            for index in np.linspace(0, count - 1, min(count, samples_per_file)).astype(int):
                image = np.asarray(handle["images"][index], dtype=np.float64)
                if not np.all(np.isfinite(image)):
                    raise UserError(
                        f"{path}: sample {index}: the image holds NaN or infinite values"
                    )
                total += image.sum(axis=(1, 2))
                squares += (image**2).sum(axis=(1, 2))
                pixels += image.shape[1] * image.shape[2]
    mean = total / pixels
    std = np.sqrt(np.maximum(squares / pixels - mean**2, 1e-12))
    stats = {
        "key": key,
        "files": [p.name for p in files],
        "method": f"mean and std per channel over up to {samples_per_file} evenly spaced "
        "samples of each training file",
        "channels": list(CHANNELS),
        "mean": mean.tolist(),
        "std": std.tolist(),
    }
    try:
        record_io.write_atomic(stats_path, stats, overwrite=True)
    except OSError:
        pass  # a read-only data directory: computed again next time
    return stats


def dataset(
    files: list[Path],
    counts: list[int],
    stats: dict,
    training: bool,
    seed: int,
    shard: tuple[int, int],
    downsample: int,
    image_shape: tuple[int, int],
):
    """Unbatched (image (H, W, 16) normalised, boxes (15, 5)) pairs of one worker's shard."""
    import tensorflow as tf

    h5py = _h5py()
    index = [(f, i) for f, count in enumerate(counts) for i in range(count)]
    count, position = shard
    index = index[position::count]
    mean = np.asarray(stats["mean"], np.float32)
    std = np.asarray(stats["std"], np.float32)
    handles: dict[int, object] = {}

    def read(file_index, sample_index):
        file_index, sample_index = int(file_index), int(sample_index)
        if file_index not in handles:
            handles[file_index] = h5py.File(files[file_index], "r")
        image, boxes = read_sample(handles[file_index], files[file_index], sample_index, downsample)
        return (image - mean) / std, boxes

    def load(file_index, sample_index):
        image, boxes = tf.numpy_function(
            read, [file_index, sample_index], [tf.float32, tf.float32], stateful=False
        )
        image.set_shape([*image_shape, len(CHANNELS)])
        boxes.set_shape([MAX_BOXES, 5])
        return image, boxes

    pairs = tf.data.Dataset.from_tensor_slices(np.asarray(index, np.int64).reshape(-1, 2))
    if training:
        pairs = pairs.shuffle(len(index), seed=seed, reshuffle_each_iteration=True)
    return pairs.map(lambda pair: load(pair[0], pair[1]), num_parallel_calls=tf.data.AUTOTUNE)


# ------------------------------------------------------------------------ synthetic data


def _vortex(yy, xx, cy, cx, radius, depth):
    """A cyclone: a Gaussian pressure low and the wind circling it (anticlockwise)."""
    dy, dx = yy - cy, xx - cx
    shape = np.exp(-(dy**2 + dx**2) / (2 * radius**2))
    speed = depth * shape * np.sqrt(dy**2 + dx**2) / radius
    angle = np.arctan2(dy, dx)
    return -depth * shape, -speed * np.sin(angle), speed * np.cos(angle), shape


def synthetic_sample(rng: np.random.Generator, height: int, width: int):
    """One (16, H, W) float32 image and its (15, 5) boxes with weather-like structure:
    smooth background fields and noise; cyclones (pressure lows with circling winds and a warm,
    wet core) sized by class; atmospheric rivers as long, narrow moisture bands."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.empty((len(CHANNELS), height, width), np.float32)
    for c in range(len(CHANNELS)):  # a smooth large-scale field per channel
        ky, kx, phase = rng.uniform(0.5, 2.0), rng.uniform(0.5, 2.0), rng.uniform(0, 2 * np.pi)
        image[c] = np.sin(2 * np.pi * (ky * yy / height + kx * xx / width) + phase)
    image += 0.3 * rng.standard_normal(image.shape).astype(np.float32)
    boxes = -np.ones((MAX_BOXES, 5), np.float32)
    scale = min(height, width)
    radii = {0: 0.05, 1: 0.08, 2: 0.14}  # fraction of the shorter side, by cyclone class
    channel = {name: i for i, name in enumerate(CHANNELS)}
    for slot in range(rng.integers(1, 4)):
        cls = int(rng.integers(0, 4))
        if cls < 3:
            radius = radii[cls] * scale * rng.uniform(0.85, 1.15)
            cy = rng.uniform(2 * radius, height - 2 * radius)
            cx = rng.uniform(2 * radius, width - 2 * radius)
            depth = 2.0 + cls
            low, u, v, core = _vortex(yy, xx, cy, cx, radius, depth)
            for name in ("PSL", "PS"):
                image[channel[name]] += low
            for name in ("U850", "UBOT"):
                image[channel[name]] += u
            for name in ("V850", "VBOT"):
                image[channel[name]] += v
            for name in ("TMQ", "PRECT", "T500"):
                image[channel[name]] += 1.5 * core
            extent = 2 * radius
            box = [cy - extent, cx - extent, cy + extent, cx + extent]
        else:  # a long, narrow band of moisture at an angle
            length, half_width = rng.uniform(0.5, 0.8) * width, 0.04 * scale
            angle = rng.uniform(-0.6, 0.6)
            y0 = rng.uniform(0.3, 0.7) * height
            x0 = rng.uniform(0.05, 0.95 - length / width * np.cos(angle)) * width
            along = (xx - x0) * np.cos(angle) + (yy - y0) * np.sin(angle)
            across = -(xx - x0) * np.sin(angle) + (yy - y0) * np.cos(angle)
            band = np.exp(-(across**2) / (2 * half_width**2)) * ((along > 0) & (along < length))
            for name in ("TMQ", "QREFHT", "PRECT"):
                image[channel[name]] += 2.5 * band
            ends_y = [y0, y0 + length * np.sin(angle)]
            ends_x = [x0, x0 + length * np.cos(angle)]
            box = [
                min(ends_y) - 2 * half_width,
                min(ends_x),
                max(ends_y) + 2 * half_width,
                max(ends_x),
            ]
        y1, x1, y2, x2 = np.clip(box, 0, [height, width, height, width])
        boxes[slot] = [np.floor(y1), np.floor(x1), np.ceil(y2), np.ceil(x2), cls]
    return image, boxes


def write_synthetic(path: Path, samples: int, height: int, width: int, seed: int) -> Path:
    """An ExtremeWeather-layout file of synthetic samples, written through a temp file."""
    h5py = _h5py()
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as handle:
            images = handle.create_dataset(
                "images", (samples, len(CHANNELS), height, width), np.float32,
                chunks=(1, len(CHANNELS), height, width),
            )  # fmt: skip
            boxes = handle.create_dataset("boxes", (samples, MAX_BOXES, 5), np.float32)
            for index in range(samples):
                images[index], boxes[index] = synthetic_sample(rng, height, width)
            handle.attrs["channels"] = ",".join(CHANNELS)
            handle.attrs["source"] = "hpcai500-tf synthetic ExtremeWeather"
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def synthetic_dir(
    cache: Path, years: list[int], samples: int, height: int, width: int, seed: int
) -> Path:
    """A directory of synthetic year files (made once; reused while the parameters match)."""
    key = hashlib.sha256(json.dumps([years, samples, height, width, seed]).encode()).hexdigest()
    directory = cache / f"extreme-weather-synthetic-{key[:12]}"
    for year in years:
        path = directory / f"climo_{year}.h5"
        if not path.is_file():
            write_synthetic(path, samples, height, width, seed + year)
    return directory
