"""The layers L1-L5 of an MLPerf system description (ORG/systems/SYSTEM.json of a results
repository, the fields mlperf-logging's system_desc_checker asks for).

Each value is the description's own text; nothing is guessed. Counts ("8") become integers;
an empty field is None. The software stack (`other_software_stack`, an object of versions in
recent rounds, a comma-separated text in early ones) is sorted by name: drivers and the kernel
to L2, collective and transport libraries (NCCL, MPI, MOFED, ...) to L3, everything else
(CUDA, cuDNN, cuBLAS, DALI, ...) to L4.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from hpcai500_tf import record as record_io
from hpcai500_tf.errors import UserError

REQUIRED = ("number_of_nodes", "accelerators_per_node", "framework")
# The counts read, each a whole number in its range (wider than any system MLPerf has listed:
# its largest had about 1,500 nodes of 8 accelerators).
COUNTS = {
    "number_of_nodes": (1, 100_000),
    "accelerators_per_node": (0, 10_000),
    "host_processors_per_node": (0, 1_000),
    "host_processor_core_count": (0, 100_000),
}
WHOLE_NUMBER = re.compile(r"[0-9]{1,12}(?:\.0*)?", re.ASCII)  # "8", "8.0"; no sign, exponent
FRAMEWORKS = {
    "tensorflow": "tensorflow",
    "tf": "tensorflow",
    "pytorch": "pytorch",
    "torch": "pytorch",
    "mxnet": "mxnet",
    "jax": "jax",
    "paddle": "paddlepaddle",
    "paddlepaddle": "paddlepaddle",
    "mindspore": "mindspore",
    "oneflow": "oneflow",
    "chainer": "chainer",
}
COMMUNICATION = ("nccl", "rccl", "hccl", "ccl", "mpi", "mofed", "ofed", "ucx", "horovod", "gloo",
                 "sharp", "nvshmem", "libfabric", "efa", "rdma")  # fmt: skip
VERSION = re.compile(r"\d+(?:\.\d+)+")


def read_description(path: Path) -> dict:
    """A system description: a JSON object holding at least REQUIRED (UserError otherwise)."""
    text = record_io.read_regular_file(path, "system description")
    description = record_io.parse_json(text, path, "system description")
    if not isinstance(description, dict):
        raise UserError(f"{path}: a system description must be a JSON object")
    missing = [key for key in REQUIRED if _text(description.get(key)) is None]
    if missing:
        raise UserError(f"{path}: the system description lacks {', '.join(missing)}")
    for key in COUNTS:
        _count(description, key, path)  # every count readable, or the description is not
    return description


def _text(value) -> str | None:
    """A field as the description states it: text (stripped), None where empty."""
    if value is None:
        return None
    if isinstance(value, int | float):
        value = str(value)
    elif not isinstance(value, str):
        value = json.dumps(value)
    return value.strip() or None


def _count(description: dict, key: str, path: Path) -> int | None:
    """A count of COUNTS as the description states it ("8", 8, "8.0"), None where empty;
    UserError for anything else: a sign, an exponent, "inf", a fraction, a count out of its
    range."""
    text = _text(description.get(key))
    if text is None:
        return None
    low, high = COUNTS[key]
    count = int(float(text)) if WHOLE_NUMBER.fullmatch(text) else None
    if count is None or not low <= count <= high:
        raise UserError(f"{path}: '{key}' is {text!r:.40}, not a count in {low}..{high}")
    return count


def framework_of(text: str) -> tuple[str, str | None]:
    """(framework, version) of a description's `framework` text: the first known name in it
    (e.g. 'MXNet NVIDIA Release 24.04' -> mxnet), else the text itself; the first dotted
    number (for NGC containers, the container's release)."""
    name = next(
        (FRAMEWORKS[word] for word in re.split(r"[^a-z0-9]+", text.lower()) if word in FRAMEWORKS),
        text,
    )
    version = VERSION.search(text)
    return name, version.group(0) if version else None


def software_stack(stack) -> dict[str, dict]:
    """L2, L3 and L4 entries of `other_software_stack` (an object, or a text 'CUDA 11.0,
    cuDNN 8.0.1, ...'), sorted by name (see the module's doc)."""
    entries: dict[str, str | None] = {}
    if isinstance(stack, dict):
        entries = {str(key): _text(value) for key, value in stack.items()}
    elif _text(stack) is not None:
        for item in re.split(r"[,;]", _text(stack)):
            version = VERSION.search(item)
            name = (item[: version.start()] if version else item).strip(" :=")
            key = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
            if key:
                entries[key] = version.group(0) if version else item.strip()
        entries["other_software_stack"] = _text(stack)  # the text as given, beside its parts
    layers: dict[str, dict] = {"L2": {}, "L3": {}, "L4": {}}
    for key, value in entries.items():
        lowered = key.lower()
        if "driver" in lowered or lowered.startswith(("kernel", "firmware")):
            layers["L2"][key] = value
        elif any(word in lowered for word in COMMUNICATION):
            layers["L3"][key] = value
        else:
            layers["L4"][key] = value
    return layers


def system_layers(description: dict, path: Path) -> dict[str, dict]:
    """L1-L5 of a system description (read with `read_description`)."""
    nodes = _count(description, "number_of_nodes", path)
    per_node = _count(description, "accelerators_per_node", path)
    cpus_per_node = _count(description, "host_processors_per_node", path)
    accelerator = _text(description.get("accelerator_model_name")) if per_node else None
    if per_node and accelerator is None:
        raise UserError(
            f"{path}: accelerators_per_node is {per_node} but no accelerator_model_name"
        )
    cpu = _text(description.get("host_processor_model_name"))
    count = None if per_node is None or nodes is None else nodes * per_node
    cpu_count = None if cpus_per_node is None or nodes is None else nodes * cpus_per_node
    if accelerator:
        summary = f"{count} x {accelerator} ({nodes} nodes)"
    else:
        summary = f"{cpu_count or '?'} x {cpu or 'CPU'} ({nodes} nodes, no accelerators)"
    field = {key: _text(description.get(key)) for key in description}
    stack = software_stack(description.get("other_software_stack"))
    framework, version = framework_of(field["framework"])
    networking = field.get("host_networking")
    return {
        "L1": {
            "summary": summary,
            "system_name": field.get("system_name"),
            "nodes": nodes,
            "accelerator_model": accelerator,
            "accelerators_per_node": per_node,
            "accelerator_count": count,
            "accelerator_memory": field.get("accelerator_memory_capacity"),
            "accelerator_memory_configuration": field.get("accelerator_memory_configuration"),
            "accelerator_interconnect": field.get("accelerator_interconnect"),
            "accelerator_interconnect_topology": field.get("accelerator_interconnect_topology"),
            "accelerator_host_interconnect": field.get("accelerator_host_interconnect"),
            "cpu_model": cpu,
            "cpus_per_node": cpus_per_node,
            "cpu_count": cpu_count,
            "cpu_cores_per_processor": _count(description, "host_processor_core_count", path),
            "host_memory_per_node": field.get("host_memory_capacity"),
            "interconnect": networking,
            "interconnect_topology": field.get("host_networking_topology"),
            "storage": field.get("host_storage_capacity") or field.get("host_storage_type"),
            "cooling": field.get("cooling"),
            "notes": field.get("hw_notes"),
        },
        "L2": {"os": field.get("operating_system"), **stack["L2"]},
        "L3": {
            "interconnect": networking,
            "accelerator_interconnect": field.get("accelerator_interconnect"),
            **stack["L3"],
        },
        "L4": stack["L4"],
        "L5": {
            "framework": framework,
            "framework_version": version,
            "framework_description": field["framework"],
            **({"framework_name": field["framework_name"]} if field.get("framework_name") else {}),
            "notes": field.get("sw_notes"),
        },
    }
