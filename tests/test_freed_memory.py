"""glibc told to keep freed memory (freed_memory.py): who decides, what the record says, and
that a process so told reuses a large freed buffer without faulting its pages in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpcai500_tf import freed_memory


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
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")
    assert freed_memory._glibc_mallopt() is None


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
