"""The native batch-norm loops (models/native/batch_norm_kernels.cc) built both ways they can
be: with this CPU's own flags (AVX-512 vector loops where the CPU has AVX-512 BF16, as on AMX
Xeons and Zen 4) and for a CPU without AVX-512 (the scalar loops), run on the same data by
tests/native/kernels_driver.cc; each result of one must match the other's. On a CPU without
AVX-512 BF16 both builds are the scalar loops, and the test checks that they agree."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from hpcai500_tf.models import native

DRIVER = native.SOURCES.parents[2] / "tests" / "native" / "kernels_driver.cc"
SCALAR_TARGET = "x86-64-v2"  # SSE4.2: no AVX-512, so the scalar loops

pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C++ compiler")


def _results(tmp_path, march: str) -> tuple[str, dict]:
    """(which loops were built, {(section, name): values}) of the driver built for `march`."""
    binary = tmp_path / f"driver-{march}"
    built = subprocess.run(
        [native._compiler(), "-O3", f"-march={march}", f"-I{native.SOURCES}",
         str(native.SOURCES / native.KERNEL_LOOPS), str(DRIVER), "-o", str(binary)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    lines = subprocess.run([binary], check=True, capture_output=True, text=True).stdout
    loops, section, results = None, None, {}
    for line in lines.splitlines():
        words = line.split()
        if words[:2] == ["#", "loops"]:
            loops = words[2]
        elif words[0] == "#":
            section = " ".join(words[1:])
        else:
            results[(section, words[0])] = np.array(words[1:], dtype=np.float64)
    return loops, results


def _targets_vector_loops(march: str) -> bool:
    """Whether the compiler, for `march`, defines what the vector loops need (a compiler too
    old to know AVX-512 BF16 builds the scalar loops on any CPU)."""
    defined = subprocess.run(
        [native._compiler(), f"-march={march}", "-dM", "-E", "-x", "c++", "-"],
        input="", capture_output=True, text=True, timeout=60, check=True,
    ).stdout.split()  # fmt: skip
    needed = ("__AVX512F__", "__AVX512BW__", "__AVX512VL__", "__AVX512BF16__")
    return all(macro in defined for macro in needed)


def test_vector_loops_match_the_scalar_loops(tmp_path):
    native_loops, built = _results(tmp_path, "native")
    scalar_loops, reference = _results(tmp_path, SCALAR_TARGET)
    assert scalar_loops == "scalar"
    vector = _targets_vector_loops("native")
    if vector:  # the compiler's reading of this CPU agrees with /proc/cpuinfo
        assert {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"} <= native.cpu_flags()
    assert native_loops == ("vector" if vector else "scalar")
    assert built.keys() == reference.keys() and len(built) == 4 * 17
    for (section, name), expected in reference.items():
        got = built[(section, name)]
        assert np.isfinite(got).all(), (section, name)
        # float32 sums over 37 rows in another order; bfloat16 outputs within one rounding step
        summed = any(word in name for word in ("sums", "squares", "products"))
        tolerance = 1e-5 if summed or section.startswith("float32") else 2.0**-7
        np.testing.assert_allclose(
            got, expected, rtol=tolerance, atol=tolerance * np.abs(expected).max(),
            err_msg=f"{section} {name}",
        )  # fmt: skip
