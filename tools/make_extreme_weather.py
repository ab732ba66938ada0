"""Write synthetic ExtremeWeather files: one `climo_YYYY.h5` per year, in the published layout
(`images` (N, 16, H, W) float32 channels first, `boxes` (N, 15, 5) rows [ymin, xmin, ymax,
xmax, class], -1 padding), with weather-like structure a detector can learn: smooth background
fields and noise, cyclones (pressure lows with circling winds) sized by class, atmospheric
rivers as long moisture bands; boxes match the features.

    python tools/make_extreme_weather.py OUT_DIR --years 1979 1980 --samples 64
        [--height 768 --width 1152] [--seed 10]

The published resolution is 768 x 1152 (56.6 MB a sample in float32); smaller sizes keep
test files small. `hpcai500-tf train extreme_weather --preset reference --data OUT_DIR
--set data.train_years=[1979] --set data.eval_years=[1980]` reads them like the real files.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpcai500_tf.data.extreme_weather import write_synthetic  # noqa: E402
from hpcai500_tf.errors import ArgumentParser  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--years", type=int, nargs="+", required=True)
    parser.add_argument("--samples", type=int, default=64, help="per year file")
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--width", type=int, default=1152)
    parser.add_argument("--seed", type=int, default=10)
    args = parser.parse_args(argv)
    if args.samples < 1 or min(args.height, args.width) < 32:
        print("make_extreme_weather: error: need --samples >= 1 and sizes >= 32", file=sys.stderr)
        return 2
    for year in args.years:
        path = args.out / f"climo_{year}.h5"
        if path.exists():
            print(f"make_extreme_weather: error: {path} exists; not overwriting", file=sys.stderr)
            return 2
        write_synthetic(path, args.samples, args.height, args.width, args.seed + year)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
