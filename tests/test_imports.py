"""The package's arrows run one way: no import cycle between its modules (imports inside
functions included) or between its subpackages; a framework-neutral core, found by path, that
imports neither TensorFlow, Keras nor torch (checked in a process where they cannot be
imported); and one seam between the two (backends.py), the only module outside the
frameworks' own folders that reaches engine/ or pytorch/."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hpcai500_tf"
FRAMEWORKS = ("tensorflow", "keras", "torch")
BACKENDS = ("engine", "pytorch")  # TensorFlow's and PyTorch's runners, reached by backends.py
# Where a framework may be imported: the runners, TensorFlow's input pipelines (data/), Keras
# models (models/), the workloads built on them, TensorFlow's FLOPs count (measure/), the
# roofline's timed TensorFlow ops, and TensorFlow's import settings. Everything else is the
# framework-neutral core: the CLI, config, checks, files, records, the registry, cluster/,
# run/, results/, mlperf/, energy/ and report/.
FRAMEWORK_SIDE = (*BACKENDS, "data", "models", "workloads", "measure", "roofline")
FRAMEWORK_MODULES = ("tensorflow_import",)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every name an import statement anywhere in the file brings in (a `from X import y`
    counts X and X.y: y may be a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: imports(path) & set(modules) - {name} for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iteratively)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_back():
    assert cycles(graph()) == []


def test_no_subpackage_imports_another_that_imports_it_back():
    """engine -> energy, never energy -> engine; models never import workloads (the
    package's own top-level modules are shared by all and left out)."""
    by_package: dict[str, set[str]] = {}
    for module, targets in graph().items():
        parts = module.split(".")
        if len(parts) < 3:
            continue
        by_package.setdefault(parts[1], set())
        for target in targets:
            other = target.split(".")
            if len(other) >= 3 and other[1] != parts[1]:
                by_package[parts[1]].add(other[1])
    assert cycles(by_package) == []


def test_the_runner_imports_nothing_of_the_report():
    """run/ (the lifecycle and what it reads) never imports report/: what watches a run (the
    live view, TensorBoard) is handed in by the caller as observers."""
    found = {
        module: sorted(t for t in targets if t.startswith("hpcai500_tf.report"))
        for module, targets in graph().items()
        if module.startswith("hpcai500_tf.run.")
    }
    assert "hpcai500_tf.run.lifecycle" in found
    assert {module: targets for module, targets in found.items() if targets} == {}


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def core() -> list[str]:
    """The framework-neutral core: every module outside FRAMEWORK_SIDE and FRAMEWORK_MODULES,
    by its name below the package."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[0] in FRAMEWORK_SIDE or parts[0] in FRAMEWORK_MODULES:
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return [name for name in names if name]


def test_the_core_is_most_of_the_package():
    """The walk finds the core's folders and leaves the frameworks' out."""
    found = core()
    expected = ["cli", "backends", "cluster.workers", "cluster.machine", "run.launch"]
    expected += ["run.state", "results.scoring", "report.console", "energy.sources"]
    assert set(expected) <= set(found)
    assert not [name for name in found if name.split(".")[0] in FRAMEWORK_SIDE]


def test_the_core_names_no_framework_anywhere():
    for name in core():
        path = PACKAGE / (name.replace(".", "/") + ".py")
        if not path.exists():
            path = PACKAGE / name.replace(".", "/") / "__init__.py"
        named = {target.split(".")[0] for target in imports(path)}
        assert not named & set(FRAMEWORKS), f"{name} imports {named & set(FRAMEWORKS)}"


def test_the_core_imports_where_no_framework_can_be_imported():
    modules = core()
    script = f"""
import importlib, sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {FRAMEWORKS!r}:
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Blocked())
for name in {modules!r}:
    importlib.import_module("hpcai500_tf." + name)
print("imported", len({modules!r}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"imported {len(modules)}" in result.stdout


def test_only_the_registry_reaches_engine_or_pytorch():
    """engine/ (TensorFlow) and pytorch/ are imported by themselves and by backends.py, which
    finds them by name; by no other module of the package."""
    reaching = {}
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        side = name.split(".")[1] if name.count(".") else ""
        if name == "hpcai500_tf.backends" or side in BACKENDS:
            continue
        found = {
            t for t in imports(path) if t.split(".")[:2] in [["hpcai500_tf", b] for b in BACKENDS]
        }
        if found:
            reaching[name] = sorted(found)
    assert reaching == {}


def test_engine_and_pytorch_never_import_each_other():
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        side = name.split(".")[1] if name.count(".") else ""
        if side in BACKENDS:
            other = {"engine": "pytorch", "pytorch": "engine"}[side]
            named = {t for t in imports(path) if t.startswith(f"hpcai500_tf.{other}")}
            assert not named, f"{name} imports {sorted(named)}"


FRAMEWORK_NAMES = {"tensorflow", "pytorch", "torch", "keras"}


def test_no_framework_name_is_compared_outside_the_registry():
    """A framework's name is looked up in backends.py (`get`), never compared as a string in
    the core (argument parsing names them as choices, which is no comparison)."""
    compared = []
    for name in core():
        if name == "backends":
            continue
        path = PACKAGE / (name.replace(".", "/") + ".py")
        if not path.exists():
            path = PACKAGE / name.replace(".", "/") / "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    values = (
                        side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
                    )
                    for value in values:
                        if isinstance(value, ast.Constant) and value.value in FRAMEWORK_NAMES:
                            compared.append(f"{name}:{node.lineno}")
    assert compared == []


def test_every_workload_implements_the_interface():
    """Each module of workloads/ with a WORKLOAD class gives every member of the interface
    (the methods on the class; the attributes on a workload built from a tiny preset)."""
    import importlib
    import inspect

    from hpcai500_tf import config
    from hpcai500_tf.workloads import build_workload
    from hpcai500_tf.workloads.interface import Workload

    members = [name for name in Workload.__dict__ if not name.startswith("_")]
    members += list(Workload.__annotations__)
    found = []
    for path in sorted((PACKAGE / "workloads").glob("*.py")):
        module = importlib.import_module(f"hpcai500_tf.workloads.{path.stem}")
        cls = getattr(module, "WORKLOAD", None)
        if cls is None:
            continue
        found.append(path.stem)
        setup = config.prepare(path.stem, "tiny", [])
        workload = build_workload(path.stem, setup.config, None)
        assert isinstance(workload, Workload) and type(workload) is cls
        for name in members:
            assert hasattr(workload, name), f"{path.stem}: no {name}"
            if callable(getattr(Workload, name, None)):
                expected = inspect.signature(getattr(Workload, name)).parameters
                given = inspect.signature(getattr(cls, name)).parameters
                assert list(given) == list(expected), f"{path.stem}.{name}{tuple(given)}"
    assert found == ["extreme_weather", "image_classification"]
