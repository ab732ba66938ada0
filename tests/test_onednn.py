"""L4's `onednn`: TensorFlow's oneDNN custom operations as TensorFlow reports them, with how
that was found. The stated default is checked with the flags of each kind of CPU the project
runs on, and against TensorFlow itself on the CPU the tests run on (whichever it is)."""

import json
import os
import subprocess
import sys

import pytest

from hpcai500_tf.engine import onednn

# /proc/cpuinfo flags (the ones that matter here) of three CPUs.
SAPPHIRE_RAPIDS = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                   "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"}  # fmt: skip
ZEN_3 = {"avx", "avx2", "fma", "sse4_2", "vaes", "vpclmulqdq"}  # EPYC 7003: no AVX-512, no VNNI
ZEN_4 = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"}


@pytest.mark.parametrize(
    ("flags", "on", "named"),
    [
        (SAPPHIRE_RAPIDS, True, "amx_tile"),
        (ZEN_4, True, "avx512_vnni, avx512_bf16"),
        (ZEN_3, False, "none of avx512_vnni"),
    ],
    ids=["intel-amx", "amd-zen4", "amd-zen3"],
)
def test_the_stated_default_follows_the_cpu(flags, on, named):
    found, why = onednn.stated_default(flags, "x86_64", "linux", None)
    assert found is on and named in why
    # The variable overrides either way (any case); other values leave the default, and say so.
    assert onednn.stated_default(flags, "x86_64", "linux", "0")[0] is False
    assert onednn.stated_default(flags, "x86_64", "linux", "False")[0] is False
    assert onednn.stated_default(flags, "x86_64", "linux", "TRUE")[0] is True
    kept, why = onednn.stated_default(flags, "x86_64", "linux", "yes")
    assert kept is on and "TF_ENABLE_ONEDNN_OPTS='yes' is not 0/1/true/false" in why


def test_no_default_is_claimed_off_linux_x86():
    assert onednn.stated_default(ZEN_4, "aarch64", "linux", None)[0] is None
    assert onednn.stated_default(ZEN_4, "x86_64", "darwin", None)[0] is None
    assert onednn.stated_default(set(), "arm64", "darwin", "1")[0] is None  # maybe no oneDNN


def test_the_record_takes_tensorflows_report_and_says_so():
    zen_3 = onednn.stated_default(ZEN_3, "x86_64", "linux", None)
    on, method = onednn.state(False, zen_3)
    assert on is False and method.startswith(onednn.REPORT) and "off by default" in method
    # A report that differs from the stated default wins, and the record says they differ.
    on, method = onednn.state(True, zen_3)
    assert on is True and "its stated default would be off" in method
    # No report (a TensorFlow without the util port): the stated default, named as such.
    on, method = onednn.state(None, zen_3)
    assert on is False and method.startswith("TensorFlow's stated default")
    unknown = onednn.stated_default(ZEN_3, "aarch64", "linux", None)
    assert onednn.state(None, unknown)[0] is None


LAYER_SCRIPT = """
import json
from hpcai500_tf.engine.library_layers import library_layers
from tensorflow.python.util import _pywrap_util_port
l4, _ = library_layers()
print(json.dumps([l4["onednn"], l4["onednn_method"], _pywrap_util_port.IsMklEnabled()]))
"""


@pytest.mark.parametrize("variable", [None, "0"], ids=["default", "off"])
def test_l4_holds_what_tensorflow_reports_on_this_cpu(variable):
    """On any CPU (AMX, Zen 3, Zen 4, ...): the record holds TensorFlow's own answer, and the
    stated default agrees with it (a disagreement names itself in the method)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    if variable is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = variable
    result = subprocess.run(
        [sys.executable, "-c", LAYER_SCRIPT], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    on, method, reported = json.loads(result.stdout.splitlines()[-1])
    assert on is reported and method.startswith(onednn.REPORT), method
    assert "would be" not in method, method
    if variable == "0":
        assert on is False and "TF_ENABLE_ONEDNN_OPTS=0 turns them off" in method


def test_how_the_state_was_found_is_no_difference_of_the_system(published_record):
    """Two records that found the same oneDNN state in other ways (or an older one that does
    not say how) compare equal in L4 and are one submission; the state itself differs."""
    import copy

    from hpcai500_tf.results import compare, scoring

    a = copy.deepcopy(published_record)
    a["layers"]["L4"].update(onednn=True, onednn_method=onednn.REPORT + ": on by default")
    b = copy.deepcopy(a)
    b["layers"]["L4"]["onednn_method"] = "TensorFlow's stated default: on by default"
    older = copy.deepcopy(a)
    del older["layers"]["L4"]["onednn_method"]
    for other in (b, older):
        assert compare.layer_differences(a, other) == ([], [])
        assert scoring.submission_key(a) == scoring.submission_key(other)
    b["layers"]["L4"]["onednn"] = False
    assert [d.field for d in compare.layer_differences(a, b)[0]] == ["onednn"]


@pytest.mark.parametrize(
    ("value", "warned"),
    [(None, False), ("0", False), ("false", False), ("", False), (" 1", False),
     ("1", True), ("True", True)],
)  # fmt: skip
def test_the_system_allocator_is_named_where_tensorflow_would_take_it(value, warned):
    environ = {} if value is None else {onednn.SYSTEM_ALLOCATOR: value}
    said = onednn.system_allocator_warning(environ, True)
    assert (said is not None) is warned
    if warned:
        assert said.startswith(f"TF_ONEDNN_USE_SYSTEM_ALLOCATOR={value}: ") and "0.66" in said
        assert onednn.system_allocator_warning(environ, None) == said  # not reported: kept
        assert onednn.system_allocator_warning(environ, False) is None  # oneDNN off: unread


def test_a_run_records_that_the_system_allocator_was_set(monkeypatch):
    from hpcai500_tf import config
    from hpcai500_tf.engine import run
    from hpcai500_tf.run.options import RunOptions

    # Python's view of the environment only: TensorFlow reads the process's once, at its first
    # oneDNN allocation, and the rest of this test process must not run on the system allocator.
    monkeypatch.setattr(os, "environ", {**os.environ, onednn.SYSTEM_ALLOCATOR: "1"})
    monkeypatch.setattr(onednn, "reported_by_tensorflow", lambda: True)
    trainer = run.build_trainer(config.prepare("image_classification", "tiny", []), RunOptions())
    warning = onednn.system_allocator_warning({onednn.SYSTEM_ALLOCATOR: "1"}, True)
    assert warning in trainer.warnings
