"""benchmarks/instances_overhead.py imports the project inside its functions (it times real
runs, so nothing is run here): every name it takes from hpcai500_tf, and every attribute it
reads off a module it imports, must still exist (a rename would first show in the lead's
timing run)."""

import ast
import importlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "instances_overhead.py"


def _project_names(tree: ast.AST) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """(module, name) of each `from hpcai500_tf... import name`, and the local names bound to
    a project module (name -> module path)."""
    names, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hpcai500_tf"):
            for alias in node.names:
                names.append((node.module, alias.name))
                path = f"{node.module}.{alias.name}"
                if importlib.util.find_spec(node.module) and _is_module(path):
                    modules[alias.asname or alias.name] = path
    return names, modules


def _is_module(path: str) -> bool:
    try:
        return importlib.util.find_spec(path) is not None
    except ModuleNotFoundError:
        return False


def test_the_benchmarks_project_imports_and_attributes_exist():
    tree = ast.parse(SCRIPT.read_text())
    names, modules = _project_names(tree)
    assert {"hpcai500_tf.run", "hpcai500_tf.cluster.instances"} <= {m for m, _ in names}
    for module, name in names:
        assert hasattr(importlib.import_module(module), name) or _is_module(f"{module}.{name}"), (
            f"{module}.{name}"
        )
    used = [
        (node.value.id, node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id in modules
    ]  # fmt: skip
    assert ("throughput", "score") in used
    for local, attribute in used:
        assert hasattr(importlib.import_module(modules[local]), attribute), f"{local}.{attribute}"


def test_the_benchmark_says_its_options():
    shown = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert all(flag in shown for flag in ("--instances", "--preset", "--rounds", "--epochs"))
