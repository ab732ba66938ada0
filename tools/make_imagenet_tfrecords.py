"""Build ImageNet-layout TFRecord shards from an image-folder tree (one folder per class).

    python tools/make_imagenet_tfrecords.py SRC_DIR OUT_DIR [--split train] [--shards 4]

SRC_DIR/<class>/<image>.{jpg,jpeg,png,...}: classes are numbered in sorted folder order from
--first-label (1 in the ImageNet layout, where 0 is the background class). Non-JPEG images are
re-encoded as JPEG. Each record holds `image/encoded`, `image/class/label`, `image/format`,
`image/height`, `image/width`, `image/filename` and a whole-image `image/object/bbox/*`.
Shards are written as `<split>-NNNNN-of-MMMMM`, all into temporary files first and renamed
only when every one is written: a failure leaves no shard, and a split is never added to.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpcai500_tf.data.image_folder import convert  # noqa: E402
from hpcai500_tf.errors import ArgumentParser, UserError  # noqa: E402


def main() -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--split", choices=("train", "validation"), default="train")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--first-label", type=int, default=1)
    args = parser.parse_args()
    try:
        count = convert(args.src, args.out, args.split, args.shards, args.first_label)
    except (ValueError, UserError) as error:
        print(f"make_imagenet_tfrecords: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {count} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
