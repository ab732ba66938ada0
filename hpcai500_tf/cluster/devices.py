"""Which GPUs this process computes on, for every framework: CUDA_VISIBLE_DEVICES as CUDA
reads it, a worker's share of them (HPCAI500_WORKER_GPUS), how a worker is kept to its share
(HPCAI500_GPU_PLACEMENT), and whether they compute in the precision asked for. The GPUs
themselves are listed by cluster/machine.py; TensorFlow's own checks of what it sees are
engine/devices.py's, PyTorch's pytorch/build.py's.
"""

from __future__ import annotations

from hpcai500_tf.errors import UserError


def _gpu_named(entry: str, uuids: list[str]) -> int | None:
    """The NVML index an entry of CUDA_VISIBLE_DEVICES names: an index, or a GPU UUID or a
    prefix of one that no other GPU shares, as CUDA accepts them."""
    if entry.isdigit():
        return int(entry) if int(entry) < len(uuids) else None
    if entry.startswith("GPU-"):
        matches = [i for i, uuid in enumerate(uuids) if uuid.lower().startswith(entry.lower())]
        return matches[0] if len(matches) == 1 else None
    return None


def cuda_visible_entries(value: str) -> list[str]:
    """The entries of a set CUDA_VISIBLE_DEVICES that CUDA reads: up to the first empty or
    negative one (CUDA ignores it and everything after it)."""
    entries = []
    for entry in (entry.strip() for entry in value.split(",")):
        if not entry or entry.startswith("-") or entry == "NoDevFiles":
            break
        entries.append(entry)
    return entries


def cuda_visible_gpus(value: str | None, uuids: list[str]) -> tuple[list[int] | None, str | None]:
    """The NVML indices of the GPUs a CUDA program here may use, given CUDA_VISIBLE_DEVICES
    (`value`, None when unset) and the UUID of each GPU in NVML order; and a one-line note
    where the variable names something that is no GPU here.

    Read as CUDA reads it: the list ends at the first empty or negative entry, and at the
    first entry naming no GPU here (CUDA ignores it and everything after it). Indices are
    taken in NVML's PCI bus order, which is CUDA's where CUDA_DEVICE_ORDER=PCI_BUS_ID or
    where all GPUs are alike; UUIDs are exact either way. MIG instances ("MIG-...") are out
    of scope: None for the indices, and a note."""
    if value is None:
        return list(range(len(uuids))), None
    chosen: list[int] = []
    for entry in cuda_visible_entries(value):
        if entry.startswith("MIG-"):
            return None, (
                f"CUDA_VISIBLE_DEVICES={value!r} names MIG instances: not resolved to GPUs "
                "(MIG is out of scope: NVML's energy counter covers the whole GPU)"
            )
        index = _gpu_named(entry, uuids)
        if index is None:
            return chosen, (
                f"CUDA_VISIBLE_DEVICES={value!r}: {entry!r} is none of the {len(uuids)} GPUs "
                "here (CUDA ignores it and the entries after it)"
            )
        if index not in chosen:
            chosen.append(index)
    return chosen, None


# A worker's share of the GPUs CUDA makes visible (positions in that list, e.g. "2,3"), set
# by `--workers N`: every worker sees every GPU (NCCL's peer-to-peer path between them needs
# that on some NCCL versions) and computes on its share (tf.config.set_visible_devices).
WORKER_GPUS = "HPCAI500_WORKER_GPUS"
# How a worker is kept to its share: set_visible_devices (every GPU visible, TensorFlow told
# its share) or cuda_visible_devices (each worker sees only its share), by this variable.
GPU_PLACEMENT = "HPCAI500_GPU_PLACEMENT"
PLACEMENTS = ("set_visible_devices", "cuda_visible_devices")


def gpu_placement(environ, entries: list[str], who: str = "worker") -> str:
    """The placement GPU_PLACEMENT asks for, or the default for these CUDA_VISIBLE_DEVICES
    `entries`: cuda_visible_devices for MIG instances (they have no CUDA IPC, so no
    peer-to-peer path to keep), set_visible_devices otherwise; an unknown one is one line."""
    mig = any(entry.startswith("MIG-") for entry in entries)
    placement = environ.get(GPU_PLACEMENT) or PLACEMENTS[1 if mig else 0]
    if placement not in PLACEMENTS:
        raise UserError(
            f"{GPU_PLACEMENT}={placement!r}: use set_visible_devices (the default: every "
            f"{who} sees every GPU and TensorFlow computes on its share) or "
            f"cuda_visible_devices (each {who} sees only its share)"
        )
    return placement


def worker_gpu_positions(value: str, count: int) -> tuple[list[int] | None, str | None]:
    """(positions, None) of the GPUs a worker's share (`value`, WORKER_GPUS) names in the list
    of `count` GPUs CUDA makes visible to it, in the order given; (None, a one-line problem)
    where it names none, a position twice, something that is not a position, or one beyond
    `count`."""
    entries = [entry.strip() for entry in value.split(",")]
    problem = None
    if not all(entry.isdigit() for entry in entries):
        problem = "is not a list of GPU positions such as 2,3"
    elif len(set(entries)) < len(entries):
        problem = "names a GPU twice"
    elif max(int(entry) for entry in entries) >= count:
        problem = f"names a GPU beyond the {count} CUDA makes visible here (positions from 0)"
    if problem:
        return None, f"{WORKER_GPUS}={value!r} {problem}"
    return [int(entry) for entry in entries], None


def computing_gpus(environ, uuids: list[str]) -> tuple[list[int] | None, str | None]:
    """The NVML indices of the GPUs this process computes on: those CUDA_VISIBLE_DEVICES
    leaves it (`cuda_visible_gpus`), narrowed to this worker's share where WORKER_GPUS is set;
    and a one-line note where either names something that is no GPU here (a share that does
    not fit is noted and not applied: the strategy refuses it before a run starts)."""
    chosen, note = cuda_visible_gpus(environ.get("CUDA_VISIBLE_DEVICES"), uuids)
    share = environ.get(WORKER_GPUS)
    if share is None or not chosen:
        return chosen, note
    positions, problem = worker_gpu_positions(share, len(chosen))
    if positions is None:
        return chosen, "; ".join(filter(None, (note, problem)))
    return [chosen[position] for position in positions], note


def gpu_selection(environ) -> str:
    """What chose this process's GPUs, for a note: CUDA_VISIBLE_DEVICES and the share, those
    of the two that are set (CUDA_VISIBLE_DEVICES named when neither is)."""
    chosen = [name for name in ("CUDA_VISIBLE_DEVICES", WORKER_GPUS) if name in environ]
    return ", ".join(f"{name}={environ.get(name)!r}" for name in chosen or ["CUDA_VISIBLE_DEVICES"])


BFLOAT16_CAPABILITY = (8, 0)  # bfloat16 tensor cores from Ampere (A100) on


def bfloat16_check(policy: str, capabilities: list[tuple[int, int]]) -> None:
    """A one-line UserError where bfloat16 was asked for on a GPU without bfloat16 arithmetic
    (before compute capability 8.0: V100, T4): it would run emulated or not at all."""
    older = sorted({c for c in capabilities if tuple(c) < BFLOAT16_CAPABILITY})
    if policy != "mixed_bfloat16" or not older:
        return
    names = ", ".join(f"{major}.{minor}" for major, minor in older)
    raise UserError(
        f"training.precision=bf16 on GPU compute capability {names}: these GPUs have no "
        "bfloat16 arithmetic (it needs 8.0, A100, or newer); use training.precision=fp16 "
        "(float16 with loss scaling, as the reference ran on V100) or mixed"
    )
