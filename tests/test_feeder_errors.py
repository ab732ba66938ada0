"""The PyTorch side's data error mid-run names the user's shard file, not TensorFlow's op text
(hpcai500_tf/pytorch/feeder.py `_read_failure`, hpcai500_tf/data/tfrecords.py `file_failing_at`)."""

from pathlib import Path

from hpcai500_tf.data import tfrecords
from hpcai500_tf.pytorch import feeder

RECORD = 12 + 100 + 4  # header, data, footer


class DataLossError(Exception):
    """Stands for tf.errors.DataLossError: only its name and text are read."""


def _shards(tmp_path: Path, corrupt: int | None) -> list[str]:
    """Three train shards of five records; the data of record 2 of shard `corrupt` flipped."""
    files = []
    for index in range(3):
        data = bytearray(b"".join(tfrecords.frame(bytes([index]) * 100) for _ in range(5)))
        if index == corrupt:
            data[2 * RECORD + 12 + 10] ^= 0xFF
        path = tmp_path / f"train-{index:05d}-of-00003"
        path.write_bytes(bytes(data))
        files.append(str(path))
    return files


# What TensorFlow 2.21 raises there (`as_numpy_iterator` over an interleave of TFRecordDataset).
OP_TEXT = (
    "{{function_node __wrapped__IteratorGetNext_output_types_1_device_/job:localhost/replica:0/"
    "task:0/device:CPU:0}} corrupted record at %d [Op:IteratorGetNext] name: "
)


def test_a_corrupt_record_names_its_shard_file_without_op_text(tmp_path):
    files = _shards(tmp_path, corrupt=1)
    error = DataLossError(OP_TEXT % (2 * RECORD + 12))  # TensorFlow names the data's offset
    text = feeder._read_failure(error, str(tmp_path), "train")
    assert text == (
        f"reading data failed: DataLossError: {files[1]}: corrupted record at {2 * RECORD + 12} "
        "(a damaged TFRecord shard file)"
    ), text


def test_a_damaged_header_is_found_by_its_shard(tmp_path):
    files = _shards(tmp_path, corrupt=None)
    data = bytearray(Path(files[2]).read_bytes())
    data[RECORD + 3] ^= 0xFF  # record 1's length
    Path(files[2]).write_bytes(bytes(data))
    assert tfrecords.file_failing_at(files, RECORD) == files[2]


def test_no_shard_at_fault_still_says_where_to_look_and_drops_op_text(tmp_path):
    _shards(tmp_path, corrupt=None)
    text = feeder._read_failure(DataLossError(OP_TEXT % 128), str(tmp_path), "train")
    assert text == (
        "reading data failed: DataLossError: corrupted record at 128 in one of the 3 train "
        f"shard files of {tmp_path}"
    ), text
    other = DataLossError("{{function_node f}} something else\n\t [[{{node IteratorGetNext}}]]")
    assert feeder._read_failure(other, None, "train") == (
        "reading data failed: DataLossError: something else"
    )
