"""Whether TensorFlow's oneDNN custom operations (its rewrite of convolutions, matrix products
and the like to oneDNN kernels) are on in this process: as TensorFlow reports it, beside the
default TensorFlow's source states, for the record's L4.

TensorFlow 2.21 (tensorflow/core/util/util.cc) decides once, at import: on Linux x86 the
operations are on by default only where the CPU has one of DEFAULT_ON_FEATURES (AVX-512 VNNI
or BF16, AVX-VNNI, AMX: Intel Sapphire Rapids and later, AMD Zen 4 and later), so an AVX2-only
CPU (AMD Zen 3, Intel before Cascade Lake) runs without them; TF_ENABLE_ONEDNN_OPTS set to
0/false or 1/true (any case) overrides the default, and any other value leaves it.

Also a warning for the record where TF_ONEDNN_USE_SYSTEM_ALLOCATOR sends oneDNN's memory to
the system allocator, a setting some vendors' recipes export, which slowed the train step here.
"""

from __future__ import annotations

import os
import platform
import sys

# /proc/cpuinfo's names of the features TensorFlow's default tests (port::CPUFeature).
DEFAULT_ON_FEATURES = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
SYSTEM_ALLOCATOR = "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"
REPORT = "TensorFlow's own report (IsMklEnabled(), tensorflow.python.util._pywrap_util_port)"


def stated_default(
    flags: set[str], machine: str, system: str, variable: str | None
) -> tuple[bool | None, str]:
    """What TensorFlow's source says it decides, from the CPU's flags, the machine
    (platform.machine()), the OS (sys.platform) and TF_ENABLE_ONEDNN_OPTS (None: unset):
    (on, why); on is None where the default is not stated here (not Linux x86, where
    TensorFlow's wheels are built with oneDNN)."""
    if not (system.startswith("linux") and machine.lower() in ("x86_64", "amd64")):
        # Elsewhere a build may lack oneDNN altogether (then the variable does nothing).
        return None, f"TensorFlow's default on {system} {machine} is not stated here"
    setting = (variable or "").lower()
    if setting in ("0", "false", "1", "true"):
        on = setting in ("1", "true")
        return on, f"TF_ENABLE_ONEDNN_OPTS={variable} turns them {'on' if on else 'off'}"
    found = [feature for feature in DEFAULT_ON_FEATURES if feature in flags]
    ignored = f"TF_ENABLE_ONEDNN_OPTS={variable!r} is not 0/1/true/false; " if variable else ""
    if found:
        return True, f"{ignored}on by default: the CPU has {', '.join(found)}"
    return False, (
        f"{ignored}off by default: the CPU has none of {', '.join(DEFAULT_ON_FEATURES)} "
        "(e.g. AVX2 only)"
    )


def state(reported: bool | None, default: tuple[bool | None, str]) -> tuple[bool | None, str]:
    """(on, method) for the record: TensorFlow's report where it gives one (`reported`; None:
    not available), else the stated default, else None; the method says which and why, and
    where the report and the stated default disagree."""
    expected, why = default
    if reported is None:
        if expected is None:
            return None, f"not known: TensorFlow does not report it here, and {why}"
        return expected, f"TensorFlow's stated default (it does not report it here): {why}"
    if expected is None or expected == reported:
        return reported, f"{REPORT}: {why}"
    said = "on" if expected else "off"
    return reported, f"{REPORT}; its stated default would be {said} ({why})"


def reported_by_tensorflow() -> bool | None:
    """TensorFlow's answer (its private util port, present since 2.x); None where absent."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return None
    is_enabled = getattr(_pywrap_util_port, "IsMklEnabled", None)
    return bool(is_enabled()) if callable(is_enabled) else None


def onednn_state(flags: set[str]) -> tuple[bool | None, str]:
    """This process's state and how it was determined, `flags` being the CPU's."""
    default = stated_default(
        flags, platform.machine(), sys.platform, os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    )
    return state(reported_by_tensorflow(), default)


def system_allocator_warning(environ, onednn_on: bool | None) -> str | None:
    """Why a run may be slower than it could be where `environ` turns TF_ONEDNN_USE_SYSTEM_ALLOCATOR
    on as TensorFlow reads it (ReadBoolFromEnvVar: 1 or true, any case, nothing stripped) and
    oneDNN is on (`onednn_on`: TensorFlow's report; its oneDNN allocator, the only reader of
    the variable, serves only then); None elsewhere. The ResNet-50 train step ran 0.657x as
    fast with it on a Zen 5 EPYC (fp32; 840,507 page faults per step against 3,989) and 0.882x
    on an AMX Xeon (bf16; 30,000 against 8,000-13,500), `benchmarks/train_step_variants.py`
    (docs/performance.md)."""
    value = environ.get(SYSTEM_ALLOCATOR)
    if onednn_on is False or value is None or value.lower() not in ("1", "true"):
        return None
    return (
        f"{SYSTEM_ALLOCATOR}={value}: oneDNN takes its memory from the system allocator, which "
        "made the ResNet-50 train step 0.66-0.88x as fast on the CPUs measured "
        "(docs/performance.md); unset it for a run whose speed counts"
    )
