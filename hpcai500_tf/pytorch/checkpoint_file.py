"""A PyTorch checkpoint (ckpt-N.pt) read whole in pure Python, before torch loads and before
the data process starts. torch.save writes a zip archive whose members each carry a CRC-32;
torch.load checks none of them (a flipped bit in a tensor's bytes loads as a wrong weight),
so a resume reads every member here and compares its CRC-32, and the archive's directory
must be there (a truncated file has none). Imports neither torch nor TensorFlow."""

from __future__ import annotations

import zipfile
from pathlib import Path

from hpcai500_tf.run.trainer import checkpoint_damaged


class MemberDamaged(zipfile.BadZipFile):
    """A member of the archive whose bytes or header do not read back as written."""


def check_whole(prefix: Path) -> None:
    """PREFIX.pt, every member read and its CRC-32 checked; a damaged file is one line naming
    it (the same words as a damaged checkpoint torch.load refuses)."""
    path = prefix.with_name(prefix.name + ".pt")
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # the first member that fails its CRC-32 or header
        if bad is not None:
            raise MemberDamaged(f"{bad} fails its CRC-32 check")
    except (zipfile.BadZipFile, EOFError, ValueError, NotImplementedError) as error:
        raise checkpoint_damaged(path, error) from None
