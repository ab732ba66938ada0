"""TFRecord framing without TensorFlow: count records from their length headers, read the first
few, and write records (for tests and benchmarks).

A TFRecord file is a sequence of records, each
    uint64 length | uint32 masked CRC-32C of the length | length bytes of data | uint32 masked
    CRC-32C of the data
all little-endian. Counting reads only the 12-byte headers (os.pread, no memory map) and checks
each length's CRC; the data are skipped, never read or decoded.
"""

from __future__ import annotations

import contextlib
import os
import struct
from pathlib import Path

import numpy as np

from hpcai500_tf.errors import UserError

HEADER = struct.Struct("<QI")
FOOTER_BYTES = 4
_MASK_DELTA = 0xA282EAD8


def _crc32c_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):  # reflected Castagnoli polynomial
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1)
    return table.astype(np.uint32)


_TABLE = _crc32c_table()
_TABLE_LIST = _TABLE.tolist()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`."""
    crc = 0xFFFFFFFF
    table = _TABLE_LIST
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """The masked CRC-32C a TFRecord stores."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _masked_crcs_of_lengths(lengths: np.ndarray) -> np.ndarray:
    """The masked CRC-32C of each length's 8 little-endian bytes, for many lengths at once."""
    data = lengths.astype("<u8").view(np.uint8).reshape(-1, 8)
    crc = np.full(len(lengths), 0xFFFFFFFF, np.uint32)
    for column in range(8):
        crc = _TABLE[(crc ^ data[:, column]) & 0xFF] ^ (crc >> 8)
    crc ^= np.uint32(0xFFFFFFFF)
    return ((crc >> 15) | (crc << 17)) + np.uint32(_MASK_DELTA)  # uint32 wraps as it should


def frame(data: bytes) -> bytes:
    """One record: header, data, footer."""
    length = struct.pack("<Q", len(data))
    return (
        length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))
    )


# Headers are read with os.pread: a block at a time while records are small (many headers per
# block), the 12 bytes alone after a large record (ImageNet's ~110 KiB JPEGs), so that about one
# page per record is fetched. A memory map read around each page fault instead: the whole file.
READ_BLOCK = 256 * 1024
SMALL_RECORD = 16 * 1024


def count_records(path: str | Path) -> int:
    """Records in one file, from its headers; UserError naming file and offset when a length's
    CRC does not match or the file ends inside a record."""
    path = Path(path)
    offsets, lengths, crcs = [], [], []
    truncated_at = None
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        position, start, block, want = 0, 0, b"", READ_BLOCK
        unpack = HEADER.unpack_from
        while position < size:
            at = position - start
            if at + HEADER.size > len(block):
                block, start, at = os.pread(fd, want, position), position, 0
                if len(block) < HEADER.size:
                    truncated_at = position
                    break
            length, crc = unpack(block, at)
            offsets.append(position)
            lengths.append(length)
            crcs.append(crc)
            position += HEADER.size + length + FOOTER_BYTES
            want = READ_BLOCK if length < SMALL_RECORD else HEADER.size
    finally:
        os.close(fd)
    if truncated_at is None and position > size:
        truncated_at = offsets[-1]
    bad = np.flatnonzero(
        _masked_crcs_of_lengths(np.asarray(lengths, np.uint64)) != np.asarray(crcs, np.uint32)
    )
    if bad.size:
        raise UserError(
            f"{path}: corrupt TFRecord file: the length header at offset {offsets[bad[0]]} "
            "fails its CRC"
        )
    if truncated_at is not None:
        raise UserError(
            f"{path}: truncated TFRecord file: the record at offset {truncated_at} "
            f"runs past the end ({size} bytes)"
        )
    return len(offsets)


def first_records(path: str | Path, count: int) -> list[tuple[int, bytes]]:
    """(offset, data) of the first `count` records; the length CRCs are checked, the data's
    are not."""
    path = Path(path)
    records = []
    with path.open("rb") as handle:
        while len(records) < count:
            offset = handle.tell()
            header = handle.read(HEADER.size)
            if not header:
                break
            if len(header) < HEADER.size:
                raise UserError(f"{path}: truncated TFRecord file at offset {offset}")
            length, crc = HEADER.unpack(header)
            if masked_crc(header[:8]) != crc:
                raise UserError(
                    f"{path}: corrupt TFRecord file: the length header at offset {offset} "
                    "fails its CRC"
                )
            data = handle.read(length)
            if len(data) < length or len(handle.read(FOOTER_BYTES)) < FOOTER_BYTES:
                raise UserError(f"{path}: truncated TFRecord file at offset {offset}")
            records.append((offset, data))
    return records


def _data_fail_at(path: Path, offset: int) -> bool:
    """Whether the record whose data begin at `offset` in `path` (its header's length CRC
    holding) runs past the end or fails its data CRC."""
    if offset < HEADER.size:
        return False
    with path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        handle.seek(offset - HEADER.size)
        header = handle.read(HEADER.size)
        if len(header) < HEADER.size:
            return False
        length, crc = HEADER.unpack(header)
        if masked_crc(header[:8]) != crc:
            return False  # no record starts there
        if offset + length + FOOTER_BYTES > size:
            return True
        data = handle.read(length)
        (footer,) = struct.unpack("<I", handle.read(FOOTER_BYTES))
    return masked_crc(data) != footer


def file_failing_at(files: list[str], offset: int) -> str | None:
    """The file of `files` that TensorFlow's "corrupted record at OFFSET" or "truncated record
    at OFFSET" (which names no file) is about: one whose record data begin at OFFSET and fail
    their CRC or run past the end, else one whose headers fail (`count_records`); None if
    none does. Read only when a run has failed: a record's data and, at most, every header."""
    candidates = [Path(f) for f in files if Path(f).is_file() and Path(f).stat().st_size >= offset]
    for path in candidates:
        with contextlib.suppress(OSError, struct.error):
            if _data_fail_at(path, offset):
                return str(path)
    for path in candidates:
        try:
            count_records(path)
        except UserError:
            return str(path)
        except OSError:
            continue
    return None
