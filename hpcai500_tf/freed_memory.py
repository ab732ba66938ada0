"""glibc told to keep the memory a process frees, for the processes that train.

By default glibc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh
mapping and unmaps it on free, and gives the top of its heap back to the system: a train step
that frees and reallocates the same large activations then page-faults through all of them on
every step. ResNet-50's bfloat16 activations at batch 32 reach 51 MB. On a 2-core AMX Xeon,
keeping freed memory took the plain PyTorch bf16 step from 13.75-13.96 to 19.15-19.75
images/s (1.40x; 276,000-401,000 page faults per step to 0-1,254), its peak memory from
2,447-2,515 to 2,891-2,920 MiB; this project's TensorFlow step gained nothing measurable
(1.007x over three alternated pairs, peak memory within 1 %; its page faults vary from 1,300
to 25,000 per step between runs with either setting). Measured with
`benchmarks/train_step_vs_pytorch.py --one ...` (docs/performance.md).

`keep_freed_memory()` sets it for this process with `mallopt` (no mmap for allocations, trim
only above 2 GiB) and for its child processes through glibc's environment variables, unless
the user set either variable or a `glibc.malloc` tunable (theirs stand) or
HPCAI500_KEEP_FREED_MEMORY=0. Where the C library is not glibc, or another allocator's malloc
is preloaded, nothing is set; `state()` says which
held, for the record (L5)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import MutableMapping

SWITCH = "HPCAI500_KEEP_FREED_MEMORY"
SET_BY_PROJECT = "HPCAI500_FREED_MEMORY_SET"  # children: the MALLOC_ variables are ours
MMAP_MAX, TRIM_THRESHOLD = "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_"
TRIM_ABOVE = 2**31 - 1  # mallopt takes an int
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h

_state: str | None = None  # what keep_freed_memory() found or did in this process


def _malloc_addresses(process) -> tuple[int | None, int | None]:
    """(the malloc `process` (this process's symbols) calls, glibc's own malloc): two
    addresses that differ where another allocator (jemalloc, tcmalloc...) is preloaded, by
    LD_PRELOAD or /etc/ld.so.preload; a preloaded library that leaves malloc alone (darshan,
    XALT) does not change it."""
    try:
        own = ctypes.CDLL("libc.so.6").malloc
    except (OSError, AttributeError):
        return None, None
    address = ctypes.cast(process.malloc, ctypes.c_void_p).value
    return address, ctypes.cast(own, ctypes.c_void_p).value


def _glibc_mallopt():
    """glibc's mallopt, or None where the C library is not glibc or malloc is another's."""
    try:
        process = ctypes.CDLL(None)
        mallopt = process.mallopt
    except (OSError, AttributeError):
        return None
    if not hasattr(process, "gnu_get_libc_version"):  # glibc's alone
        return None
    called, own = _malloc_addresses(process)
    if called is None or called != own:
        return None  # another allocator's malloc: its own settings rule
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def keep_freed_memory(environ: MutableMapping[str, str] | None = None, mallopt=None) -> str:
    """Tell glibc to keep freed memory in this process and its children, where the user has
    not decided otherwise; returns `state()`."""
    global _state
    environ = os.environ if environ is None else environ
    if _state is not None and environ is os.environ:
        return _state  # asked again in the same process
    users = [f"{name}={environ[name]}" for name in (MMAP_MAX, TRIM_THRESHOLD) if name in environ]
    tunables = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc." in tunables:  # glibc's other way to say it: theirs stand too
        users.append(f"GLIBC_TUNABLES={tunables}")
    if environ.get(SET_BY_PROJECT) == "1" and users:
        _state = f"kept (project default, from the parent process: {', '.join(users)})"
    elif environ.get(SWITCH, "1").strip() == "0":
        _state = f"off ({SWITCH}=0)"
    elif users:
        _state = f"the user's glibc settings ({', '.join(users)})"
    else:
        mallopt = _glibc_mallopt() if mallopt is None else mallopt
        if mallopt is None:
            _state = "not set: malloc is not glibc's (another C library or a preloaded one)"
        elif mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_ABOVE) == 1:
            environ[MMAP_MAX], environ[TRIM_THRESHOLD] = "0", str(TRIM_ABOVE)
            environ[SET_BY_PROJECT] = "1"
            _state = f"kept (project default: {MMAP_MAX}=0, {TRIM_THRESHOLD}={TRIM_ABOVE})"
        else:
            _state = "not set: glibc's mallopt refused it"
    return _state


def state() -> str:
    """How this process's allocator treats freed memory, as `keep_freed_memory` left it."""
    return _state or "glibc's defaults (not asked to keep freed memory)"
