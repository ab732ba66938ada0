"""No function in the package runs over 80 lines (the project's bound): counted from its `def`
line to its last line, docstring and comments included, nested functions counted in the
function that holds them and on their own."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hpcai500_tf"
MAX_LINES = 80


def too_long(source: str) -> list[tuple[str, int, int]]:
    """(name, first line, length) of each function in `source` over MAX_LINES."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_LINES:
                found.append((node.name, node.lineno, length))
    return found


def test_no_function_in_the_package_is_over_80_lines():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line} {name} ({length} lines)"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name, line, length in too_long(path.read_text())
    ]
    assert offenders == [], "over 80 lines: " + "; ".join(offenders)


def test_the_count_runs_from_def_to_the_last_line():
    body = "".join(f"    x = {i}\n" for i in range(MAX_LINES - 2))
    fits = f"@decorated\ndef fits():\n    '''doc'''\n{body}"  # def + doc + 78 = 80 lines
    assert too_long(fits) == []
    over = f"class A:\n    async def over(self):\n        '''doc'''\n{body}        x = 0\n"
    assert too_long(over.replace("\n    x", "\n        x")) == [("over", 2, MAX_LINES + 1)]
