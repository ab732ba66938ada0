"""ExtremeWeather (Racah et al., 2017) HDF5 files into tf.data, and a synthetic generator.

Layout, one file per year (`climo_YYYY.h5`):
- `images`: (N, 16, H, W) float, channels in CHANNELS order (768 x 1152 in the published data);
- `boxes`: (N, 15, 5) rows [ymin, xmin, ymax, xmax, class] in pixels, unused rows all -1;
- classes 0-3: CLASSES.

Samples are read one at a time (a year is 62 GB: a file is never loaded whole). Every file's
`boxes` are checked when the dataset is built (missing datasets, shapes, dtypes, boxes outside
the image, unknown classes, image bytes past the end of the file: one line naming file and
sample); each image is checked as it is read (non-finite values stop the run naming file and
sample: a bad sample never becomes a zero image). Per-channel mean and standard deviation over
the training files are computed once and kept beside the data in `normalization.json`.
`downsample` averages f x f pixel blocks and scales the boxes with them.

Two readers (`reader`), the same elements in the same order:
- "pread": where every sample's image lies whole and unfiltered in its file (a contiguous
  `images`, or chunks of whole samples without compression, shuffle or checksums) in
  little-endian float32 or float64. h5py only finds the byte offsets when the dataset is built;
  each sample is then one `os.preadv` (the GIL released while it reads) into an aligned buffer
  that TensorFlow takes without a copy, and the check, downsampling and normalisation are
  TensorFlow ops: samples are read and prepared in parallel. (TensorFlow has no op reading a
  byte range: FixedLengthRecordDataset's header_bytes reads through every byte it skips.)
- "h5py": any other file (compressed or finely chunked). h5py reads and NumPy prepares each
  sample inside `tf.numpy_function`; h5py's global lock serialises every read, decompression
  included, so more parallel calls would not help: about one core's worth of samples a process.
  `h5repack -l images:CONTI -f images:NONE IN OUT` once makes a file readable by "pread".
Both run the same float32 operations in the same order (no reductions: `_block_mean`; x - mean
times 1 / std), so their images are equal bit for bit on any CPU, except subnormal values,
which TensorFlow flushes to zero.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from pathlib import Path

import numpy as np

from hpcai500_tf import record as record_io
from hpcai500_tf.errors import UserError
from hpcai500_tf.validation import is_finite_number

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
        if count == 0:
            raise UserError(f"{path}: holds no samples ('images' is empty)")
        if boxes.shape != (count, MAX_BOXES, 5):
            raise UserError(f"{path}: 'boxes' must be ({count}, 15, 5), got {boxes.shape}")
        if boxes.dtype.kind not in "fiu":
            raise UserError(f"{path}: 'boxes' must hold numbers, got {boxes.dtype}")
        try:
            rows = np.asarray(boxes[...], dtype=np.float64)
        except OSError as error:
            raise UserError(f"{path}: 'boxes' cannot be read ({error})") from None
        _image_offsets(handle, path)  # refuses images whose bytes run past the end of the file
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


def _image_offsets(handle, path: Path) -> tuple[np.ndarray | None, str]:
    """The byte offset of every sample's image in the file and '' where each lies whole and
    unfiltered in little-endian float32 or float64 (the "pread" reader); (None, why not)
    otherwise. Image bytes past the end of the file: UserError."""
    h5d = _h5py().h5d
    images = handle["images"]
    count, channels, height, width = images.shape
    sample_bytes = channels * height * width * images.dtype.itemsize
    size = path.stat().st_size
    plist = images.id.get_create_plist()
    layout = plist.get_layout()
    offsets, why, ends = None, "", []  # ends: (end byte, last sample) of each stored piece
    if layout == h5d.CONTIGUOUS:
        start = images.id.get_offset()
        if plist.get_external_count():
            why = "'images' is stored in external files"
        elif start is None:
            why = "'images' was never written (fill values)"
        else:
            offsets = start + sample_bytes * np.arange(count, dtype=np.int64)
            ends = [(offsets[-1] + sample_bytes, count - 1)] if count else []
    elif layout == h5d.CHUNKED:
        per_chunk = images.chunks[0]
        stored = (
            _each_chunk(images.id.chunk_iter) if hasattr(images.id, "chunk_iter")
            else map(images.id.get_chunk_info, range(images.id.get_num_chunks()))
        )  # fmt: skip
        # (first sample, byte offset, stored size) of every written chunk
        chunks = [(c.chunk_offset[0], c.byte_offset, c.size) for c in stored]
        ends = [(offset + size_, min(first + per_chunk, count) - 1)
                for first, offset, size_ in chunks]  # fmt: skip
        whole = tuple(images.chunks[1:]) == (channels, height, width)
        if plist.get_nfilters():
            why = "'images' is filtered (compressed, shuffled or checksummed)"
        elif not whole:
            why = f"'images' is chunked {images.chunks}: a sample spans several chunks"
        elif len(chunks) < -(-count // per_chunk):
            why = "'images' has chunks never written (fill values)"
        else:
            offsets = np.empty(count, np.int64)
            for first, offset, _ in chunks:
                last = min(first + per_chunk, count)
                offsets[first:last] = offset + sample_bytes * np.arange(last - first)
    else:
        why = "'images' has a compact or virtual layout"
    for end, last in ends:
        if end > size:
            raise UserError(
                f"{path}: truncated: sample {last}'s image ends at byte {end}, the file has "
                f"{size} bytes"
            )
    dtype = images.dtype
    if offsets is not None and not (
        dtype.kind == "f" and dtype.itemsize in (4, 8) and dtype.str[0] == "<"
    ):
        offsets, why = None, f"'images' holds {dtype.str}, not little-endian float32 or float64"
    if offsets is not None and count:  # h5py and the offsets must agree on the bytes
        with path.open("rb") as raw:
            for index in {0, count - 1}:
                row = np.asarray(images[index, 0, 0]).tobytes()
                if os.pread(raw.fileno(), len(row), int(offsets[index])) != row:
                    return None, "'images' bytes are not where HDF5 says (offsets disagree)"
    return offsets, why


def _each_chunk(chunk_iter) -> list:
    found: list = []
    chunk_iter(found.append)
    return found


def reader(files: list[Path]) -> tuple[str, str]:
    """("pread", "") where every file's images can be read by offset; ("h5py", "FILE: why")
    where one cannot (see the module's docstring)."""
    h5py = _h5py()
    for path in files:
        with h5py.File(path, "r") as handle:
            offsets, why = _image_offsets(handle, path)
        if offsets is None:
            return "h5py", f"{path}: {why}"
    return "pread", ""


def _block_mean(image, f: int):
    """Means of f x f pixel blocks over the last two axes of a (C, H, W) NumPy array or
    tensor: the blocks' pixels added one at a time in row-major order, then multiplied by
    1 / f^2. Both are the same float32 operations in NumPy and TensorFlow; in TensorFlow each
    addition is one step of a loop, which graph rewrites (an AddN's regrouping, a division
    turned into a multiplication) cannot reorder."""
    channels, height, width = image.shape[0], image.shape[1] // f * f, image.shape[2] // f * f
    scale = np.float32(1 / (f * f))
    if isinstance(image, np.ndarray):
        total = image[:, 0:height:f, 0:width:f].copy()
        for step in range(1, f * f):
            total += image[:, step // f : height : f, step % f : width : f]
        return total * scale
    import tensorflow as tf

    def add(total, step):
        dy, dx = step // f, step % f
        block = tf.strided_slice(image, [0, dy, dx], [channels, height, width], [1, f, f])
        return total + tf.ensure_shape(block, total.shape)

    total = tf.foldl(add, tf.range(1, f * f), image[:, 0:height:f, 0:width:f])
    return total * scale


def _scaled_boxes(boxes: np.ndarray, downsample: int) -> np.ndarray:
    """(..., 15, 5) float32 boxes with the used rows' corners divided by `downsample`."""
    boxes = np.array(boxes, dtype=np.float32)
    if downsample > 1:
        used = boxes[..., 4] >= 0
        boxes[used, :4] /= downsample
    return boxes


def read_sample(handle, path: Path, index: int, downsample: int) -> tuple[np.ndarray, np.ndarray]:
    """One (H/f, W/f, 16) float32 image (channels last) and its (15, 5) boxes, scaled."""
    try:
        image = np.asarray(handle["images"][index], dtype=np.float32)
        boxes = np.asarray(handle["boxes"][index], dtype=np.float32)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: sample {index} cannot be read ({error})") from None
    if not np.all(np.isfinite(image)):
        raise UserError(_non_finite(path, index))
    if downsample > 1:
        image = _block_mean(image, downsample)
    return image.transpose(1, 2, 0), _scaled_boxes(boxes, downsample)


def _non_finite(path: Path, index: int) -> str:
    return f"{path}: sample {index}: the image holds NaN or infinite values"


def normalization(files: list[Path], data_dir: Path, samples_per_file: int = 64) -> dict:
    """Per-channel mean and std over (an even subsample of) the training files, computed once
    and kept in DATA_DIR/normalization.json keyed by the files' names and sizes."""
    key = hashlib.sha256(
        json.dumps([[p.name, p.stat().st_size] for p in files]).encode()
    ).hexdigest()[:16]
    stats_path = data_dir / STATS_FILE
    stored = _stored_normalization(stats_path, key)
    if stored is not None:
        return stored
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
                    raise UserError(_non_finite(path, index))
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


def _stored_normalization(path: Path, key: str) -> dict | None:
    """The statistics kept at `path` where they are those of the files `key` names and whole:
    a finite mean and a positive finite std per channel; None otherwise (another file set,
    or a file damaged or not ours: computed again, and the file replaced)."""
    if not os.path.lexists(path):
        return None
    try:
        stored = record_io.parse_json(
            record_io.read_regular_file(path, "normalization file"), path, "normalization file"
        )
    except UserError:
        return None
    if not isinstance(stored, dict) or stored.get("key") != key:
        return None
    for name, floor in (("mean", -math.inf), ("std", 0.0)):
        values = stored.get(name)
        if not isinstance(values, list) or len(values) != len(CHANNELS):
            return None
        for value in values:  # beyond 1e30 no channel's statistic is (and ints beyond float)
            if not (is_finite_number(value) and floor < value and abs(value) < 1e30):
                return None
    return stored


def dataset(
    files: list[Path],
    counts: list[int],
    stats: dict,
    training: bool,
    seed: int,
    shard: tuple[int, int],
    downsample: int,
    image_shape: tuple[int, int],
    read_with: str = "auto",
    sample=None,
):
    """Unbatched (image (H, W, 16) normalised, boxes (15, 5)) pairs of one worker's shard, in
    the order of the (file, sample) pairs, shuffled by `seed` when training. `read_with`:
    "auto" (`reader(files)`), "pread" or "h5py" (see the module's docstring). `sample`
    (training only): the examples to read instead of each pair once, as indices into the
    pairs in file order (a bootstrap sample, data/bootstrap.py; duplicates read twice)."""
    import tensorflow as tf

    if read_with not in ("auto", "pread", "h5py"):
        raise ValueError(f"read_with {read_with!r}: 'auto', 'pread' or 'h5py'")
    kind, why = reader(files) if read_with != "h5py" else ("h5py", "")
    if read_with == "pread" and kind != "pread":
        raise UserError(f"{why}: the pread reader cannot read it")
    index = [(f, i) for f, count in enumerate(counts) for i in range(count)]
    if sample is not None and training:
        index = [index[i] for i in sample]
    count, position = shard
    index = index[position::count]
    mean = np.asarray(stats["mean"], np.float32)
    scale = np.float32(1) / np.asarray(stats["std"], np.float32)  # multiplied: see _block_mean
    pairs = tf.data.Dataset.from_tensor_slices(np.asarray(index, np.int64).reshape(-1, 2))
    if training:
        pairs = pairs.shuffle(len(index), seed=seed, reshuffle_each_iteration=True)
    if kind == "pread":
        load = _pread_loader(files, mean, scale, downsample, image_shape)
    else:
        load = _h5py_loader(files, mean, scale, downsample, image_shape)
    return pairs.map(lambda pair: load(pair[0], pair[1]), num_parallel_calls=tf.data.AUTOTUNE)


def _aligned(size: int) -> np.ndarray:
    """`size` bytes at a 64-byte boundary: TensorFlow takes such an array without a copy."""
    raw = np.empty(size + 64, np.uint8)
    return raw[-raw.ctypes.data % 64 :][:size]


class _Descriptors(dict):
    """File index -> open file descriptor, closed with the dataset's function."""

    def __del__(self):
        for descriptor in self.values():
            try:
                os.close(descriptor)
            except OSError:
                pass


def _h5py_loader(files, mean, scale, downsample, image_shape):
    """(file, sample) -> (image, boxes) through h5py and NumPy in one tf.numpy_function."""
    import tensorflow as tf

    h5py = _h5py()
    handles: dict[int, object] = {}

    def read(file_index, sample_index):
        file_index, sample_index = int(file_index), int(sample_index)
        if file_index not in handles:
            handles[file_index] = h5py.File(files[file_index], "r")
        image, boxes = read_sample(handles[file_index], files[file_index], sample_index, downsample)
        return (image - mean) * scale, boxes

    def load(file_index, sample_index):
        image, boxes = tf.numpy_function(
            read, [file_index, sample_index], [tf.float32, tf.float32], stateful=False
        )
        image.set_shape([*image_shape, len(CHANNELS)])
        boxes.set_shape([MAX_BOXES, 5])
        return image, boxes

    return load


def _pread_loader(files, mean, scale, downsample, image_shape):
    """(file, sample) -> (image, boxes): the image's bytes by one pread at its offset (the only
    Python, without the GIL while it reads), checked and prepared by TensorFlow ops; the boxes,
    read and scaled when the dataset is built, gathered from a table."""
    import tensorflow as tf

    h5py = _h5py()
    offsets, boxes, dtypes, shapes = [], [], [], set()
    for path in files:
        with h5py.File(path, "r") as handle:
            offsets.append(_image_offsets(handle, path)[0])
            boxes.append(_scaled_boxes(handle["boxes"][...], downsample))
            dtypes.append(handle["images"].dtype)
            shapes.add(handle["images"].shape[1:])
    if len(shapes) != 1:
        raise UserError(f"the files hold images of different shapes {sorted(shapes)}")
    (shape,) = shapes
    values = int(np.prod(shape))
    rows = [len(file_offsets) for file_offsets in offsets]
    first = tf.constant(np.cumsum([0, *rows[:-1]]), tf.int64)  # each file's first table row
    offset_table = tf.constant(np.concatenate(offsets), tf.int64)
    box_table = tf.constant(np.concatenate(boxes), tf.float32)
    descriptors = _Descriptors()

    def read(file_index, sample_index, offset):
        file_index, offset = int(file_index), int(offset)
        path, dtype = files[file_index], dtypes[file_index]
        size = values * dtype.itemsize
        buffer = _aligned(size)
        try:
            descriptor = descriptors.get(file_index)
            if descriptor is None:
                opened = os.open(path, os.O_RDONLY)
                descriptor = descriptors.setdefault(file_index, opened)
                if descriptor != opened:  # another call opened it first
                    os.close(opened)
            done = 0
            while done < size:
                got = os.preadv(descriptor, [buffer[done:]], offset + done)
                if not got:
                    raise OSError(f"the file ends before byte {offset + size}")
                done += got
        except OSError as error:
            why = f"sample {int(sample_index)} cannot be read ({error})"
            raise UserError(f"{path}: {why}") from None
        if dtype.itemsize == 4:
            return buffer.view(dtype)
        image = _aligned(values * 4).view(np.float32)
        np.copyto(image, buffer.view(dtype), casting="same_kind")  # rounded as read_sample does
        return image

    def non_finite(file_index, sample_index):
        raise UserError(_non_finite(files[int(file_index)], int(sample_index)))

    def load(file_index, sample_index):
        row = tf.gather(first, file_index) + sample_index
        image = tf.numpy_function(
            read, [file_index, sample_index, tf.gather(offset_table, row)], tf.float32,
            stateful=False,
        )  # fmt: skip
        image = tf.reshape(image, shape)
        image = tf.cond(
            tf.reduce_all(tf.math.is_finite(image)),
            lambda: image,
            lambda: tf.reshape(
                tf.numpy_function(non_finite, [file_index, sample_index], tf.float32), shape
            ),
        )
        if downsample > 1:
            image = _block_mean(image, downsample)
        image = (image - mean[:, None, None]) * scale[:, None, None]
        image = tf.ensure_shape(tf.transpose(image, [1, 2, 0]), [*image_shape, len(CHANNELS)])
        return image, tf.ensure_shape(tf.gather(box_table, row), [MAX_BOXES, 5])

    return load


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
