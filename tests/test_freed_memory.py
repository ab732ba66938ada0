"""glibc told to keep freed memory (freed_memory.py): who decides, what the record says, and
that a process so told reuses a large freed buffer without faulting its pages in again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpcai500_tf import freed_memory

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _own_state(monkeypatch):
    monkeypatch.setattr(freed_memory, "_state", None)  # what these tests set stays here


def _recording_mallopt(calls: list, answer: int = 1):
    def mallopt(option, value):
        calls.append((option, value))
        return answer

    return mallopt


def test_sets_this_process_and_its_children():
    environ, calls = {}, []
    said = freed_memory.keep_freed_memory(environ, _recording_mallopt(calls))
    assert calls == [(freed_memory.M_MMAP_MAX, 0), (freed_memory.M_TRIM_THRESHOLD, 2**31 - 1)]
    assert environ == {
        "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1),
        "HPCAI500_FREED_MEMORY_SET": "1",
    }  # fmt: skip
    assert said.startswith("kept (project default") and freed_memory.state() == said
    # A child inherits them: the project's, not the user's.
    child = freed_memory.keep_freed_memory(dict(environ), _recording_mallopt([]))
    assert child.startswith("kept (project default, from the parent process")


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"MALLOC_MMAP_MAX_": "65536"}, "the user's glibc settings (MALLOC_MMAP_MAX_=65536)"),
        ({"HPCAI500_KEEP_FREED_MEMORY": "0"}, "off (HPCAI500_KEEP_FREED_MEMORY=0)"),
    ],
)
def test_the_users_choice_stands(environ, expected):
    calls, before = [], dict(environ)
    assert freed_memory.keep_freed_memory(environ, _recording_mallopt(calls)) == expected
    assert calls == [] and environ == before


def test_a_refusing_allocator_leaves_the_environment_alone():
    environ = {}
    said = freed_memory.keep_freed_memory(environ, _recording_mallopt([], answer=0))
    assert said == "not set: glibc's mallopt refused it" and environ == {}


def test_a_preloaded_allocator_is_not_glibcs(monkeypatch):
    """Another allocator's malloc (from LD_PRELOAD or /etc/ld.so.preload) is the one the
    process calls, not glibc's: nothing is set."""
    monkeypatch.setattr(freed_memory, "_malloc_addresses", lambda process: (0x1000, 0x2000))
    assert freed_memory._glibc_mallopt() is None
    monkeypatch.setattr(freed_memory, "_malloc_addresses", lambda process: (None, None))
    assert freed_memory._glibc_mallopt() is None


def test_a_glibc_malloc_tunable_is_the_users_choice():
    environ, calls = {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=8"}, []
    said = freed_memory.keep_freed_memory(environ, _recording_mallopt(calls))
    assert said == "the user's glibc settings (GLIBC_TUNABLES=glibc.malloc.mmap_max=8)"
    assert calls == [] and environ == {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=8"}


PRELOADED = """
from hpcai500_tf import freed_memory
print(freed_memory.keep_freed_memory({}, None))
"""


@pytest.mark.skipif(freed_memory._glibc_mallopt() is None, reason="malloc is not glibc's")
def test_a_preloaded_library_that_leaves_malloc_alone_does_not_stop_it():
    """Sites preload tracers (darshan, XALT) that do not replace malloc: glibc's is still the
    one called, so freed memory is kept (here libm stands in for such a library)."""
    libm = subprocess.run(
        [sys.executable, "-c", "import ctypes.util; print(ctypes.util.find_library('m'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "LD_PRELOAD": libm, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", PRELOADED], capture_output=True, text=True,
                          check=True, env=env)  # fmt: skip
    assert done.stdout.strip().startswith("kept (project default")


REUSE = """
import ctypes, resource, sys
from hpcai500_tf import freed_memory
if sys.argv[1] == "keep":
    freed_memory.keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 64 << 20
faults = []
for _ in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer = libc.malloc(size)
    ctypes.memset(buffer, 1, size)
    libc.free(buffer)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults[1])
"""


@pytest.mark.skipif(freed_memory._glibc_mallopt() is None, reason="malloc is not glibc's")
def test_a_freed_buffer_is_reused_without_faulting_again(monkeypatch):
    for name in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "HPCAI500_KEEP_FREED_MEMORY",
                 "HPCAI500_FREED_MEMORY_SET"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)

    def second_round_faults(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", REUSE, mode], capture_output=True,
                              text=True, check=True)  # fmt: skip
        return int(done.stdout.split()[-1])

    pages = (64 << 20) // 4096
    assert second_round_faults("default") > pages // 2  # glibc unmapped it and maps it again
    assert second_round_faults("keep") < pages // 20
