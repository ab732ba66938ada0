"""TensorBoard event files read without TensorFlow: the record framing, its checksums and the
scalars of one tag.

The tensorboard package's own loaders read records through TensorFlow wherever TensorFlow can
be imported (its start-up costs seconds and prints TensorFlow's C++ notices), so the framing
is read here and each record parsed with the package's Event proto, which needs only
protobuf. A record is an 8-byte little-endian length, that length's masked CRC-32C, the data
and the data's masked CRC-32C (TensorFlow's TFRecord format). The checksums are computed with
numpy over all records of one length at once: a long run's file holds a million records.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np

from hpcai500_tf.errors import UserError
from hpcai500_tf.files import open_regular_file

_LENGTH, _CHECK = 8, 4  # bytes of a record's length and of each checksum
# Records longer than this (graphs, images: never a scalar) are skipped, their data unchecked:
# one long record's checksum is a byte-by-byte loop in numpy.
MAX_CHECKED_RECORD = 1 << 16


def _crc32c_table() -> np.ndarray:
    """The byte table of CRC-32C (Castagnoli, reflected polynomial 0x82F63B78)."""
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1)
    return table.astype(np.uint32)


_TABLE = _crc32c_table()


def masked_crc32c(data: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """The masked CRC-32C, as TFRecord stores it (rotated right by 15 bits, plus a constant),
    of the `width` bytes of `data` (uint8) at each of `starts`."""
    crc = np.full(len(starts), 0xFFFFFFFF, dtype=np.uint32)
    for column in range(width):
        crc = _TABLE[(crc ^ data[starts + column]) & 0xFF] ^ (crc >> 8)
    crc ^= np.uint32(0xFFFFFFFF)
    return ((crc >> 15) | (crc << 17)) + np.uint32(0xA282EAD8)  # uint32 arrays wrap, as meant


def _checked(data: np.ndarray, starts: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """Whether the `widths[i]` bytes at each `starts[i]` match the checksum stored after them."""
    good = np.zeros(len(starts), dtype=bool)
    for width in np.unique(widths).tolist():
        chosen = np.flatnonzero(widths == width)
        at = starts[chosen] + width
        stored = sum(data[at + i].astype(np.uint32) << np.uint32(8 * i) for i in range(_CHECK))
        good[chosen] = masked_crc32c(data, starts[chosen], width) == stored
    return good


def _framing(raw: bytes) -> tuple[list[int], list[int], str | None]:
    """Each record's offset and data length, as far as the framing fits the file, and where
    it does not."""
    offsets: list[int] = []
    lengths: list[int] = []
    offset = 0
    while offset < len(raw):
        if offset + _LENGTH + _CHECK > len(raw):
            return offsets, lengths, "is cut off (its last record is incomplete)"
        (length,) = struct.unpack_from("<Q", raw, offset)
        end = offset + _LENGTH + _CHECK + length + _CHECK
        if end > len(raw):
            damage = "is cut off or damaged (a record runs past the end of the file)"
            return offsets, lengths, damage
        offsets.append(offset)
        lengths.append(length)
        offset = end
    return offsets, lengths, None


def read_records(path: Path) -> tuple[list[bytes], str | None]:
    """The data of an event file's records (up to its first damaged one; records longer than
    MAX_CHECKED_RECORD left out) and what is damaged: None where the file ends exactly after
    a good record. Refuses (UserError) a file that cannot be opened or read."""
    with open_regular_file(path, "TensorBoard event file") as handle:
        try:
            raw = handle.read()
        except OSError as error:
            raise UserError(f"{path}: cannot read ({error.strerror or error})") from None
    framed_offsets, framed_lengths, damage = _framing(raw)
    offsets = np.array(framed_offsets, dtype=np.int64)
    lengths = np.array(framed_lengths, dtype=np.int64)
    data = np.frombuffer(raw, dtype=np.uint8)
    good = _checked(data, offsets, np.full(len(offsets), _LENGTH))
    short = lengths <= MAX_CHECKED_RECORD
    good[short] &= _checked(data, offsets[short] + _LENGTH + _CHECK, lengths[short])
    bad = np.flatnonzero(~good)
    if len(bad):
        damage = f"is damaged (record {bad[0] + 1} fails its checksum)"
        offsets, lengths, short = offsets[: bad[0]], lengths[: bad[0]], short[: bad[0]]
    start = _LENGTH + _CHECK
    return [
        raw[offset + start : offset + start + length]
        for offset, length in zip(offsets[short].tolist(), lengths[short].tolist(), strict=True)
    ], damage


def scalar_values(records: list[bytes], tag: str) -> dict[int, float]:
    """One tag's finite values by step, written either as a plain scalar (simple_value) or as
    a one-element summary tensor (TensorFlow 2's and the tensorboard writer's scalars). A
    record that is no Event proto raises protobuf's DecodeError."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.util import tensor_util

    values = {}
    for record in records:
        event = Event.FromString(record)
        for value in event.summary.value:
            if value.tag != tag:
                continue
            if value.HasField("simple_value"):
                values[event.step] = float(value.simple_value)
            elif value.HasField("tensor"):
                array = tensor_util.make_ndarray(value.tensor)
                if array.size == 1:
                    values[event.step] = float(array.reshape(()))
    return {step: value for step, value in values.items() if math.isfinite(value)}
