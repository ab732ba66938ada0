"""The README and the manual in docs/: every relative link leads somewhere, and the README stays
a two-minute read that still holds the two commands."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_LIMIT = 12_000  # characters

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+).+?\1")
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
FENCE = re.compile(r"\s{0,3}(```|~~~)")
HEADING = re.compile(r"\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) for the lines outside fenced code blocks."""
    lines, fence = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        opened = FENCE.match(line)
        if opened and (fence is None or opened.group(1) == fence):
            fence = opened.group(1) if fence is None else None
        elif fence is None:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, only letters, digits, spaces, - and _ kept,
    spaces become hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, repeats numbered -1, -2 as GitHub does."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        if heading := HEADING.match(line):
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            found.add(f"{base}-{count}" if count else base)
            seen[base] = count + 1
    return found


def broken_links(page: Path) -> list[str]:
    """`file:line: target (why)` for each relative link of `page` that leads nowhere."""
    broken = []
    for number, line in _prose_lines(page.read_text(encoding="utf-8")):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if SCHEME.match(target):
                continue
            path, _, fragment = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            if not resolved.exists():
                broken.append(f"{where} (no such file or directory)")
            elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
                broken.append(f"{where} (no heading #{fragment} in {resolved.name})")
    return broken


def test_every_relative_link_leads_to_a_file_and_heading():
    broken = [entry for page in PAGES for entry in broken_links(page)]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_is_short_and_keeps_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text) < README_LIMIT, f"README.md: {len(text)} characters, not under {README_LIMIT}"
    for command in ("bash .ci/run", "hpcai500-tf train image_classification"):
        assert command in text, f"README.md lost the command {command!r}"


# docs/development.md's map of the tree: every path it names is there.

DEVELOPMENT = ROOT / "docs" / "development.md"
PACKAGE = ROOT / "hpcai500_tf"
DESCRIPTION_COLUMN = 27  # where the Layout block's descriptions start
ENTRY = re.compile(r"( *)(\S.*?)(?: {2,}(.*))?$")
PY_FILE = re.compile(r"(?<![\w/.])((?:\w+/)*\w+\.py)\b")
BACKTICKED_PY = re.compile(r"`((?:\w+/)*\w+\.py)`")
COUNTS = {"five": 5, "six": 6, "seven": 7, "eight": 8}


def layout_paths() -> list[Path]:
    """Each file and folder the Layout block names: its entries (a name, or names separated by
    commas, below the folder the indentation says) and each x.py their descriptions name (in
    the entry's folder; a/x.py below the package)."""
    block = DEVELOPMENT.read_text(encoding="utf-8").split("## Layout", 1)[1].split("```")[1]
    folders, paths, entry_dir = {0: ROOT}, [], ROOT
    for line in block.splitlines()[1:]:
        if not line.strip():
            continue
        indent, names, description = ENTRY.match(line).groups()
        if len(indent) >= DESCRIPTION_COLUMN:  # a description's next line
            description, names = line.strip(), None
        for name in names.split(", ") if names else []:
            path = folders[len(indent)] / name
            paths.append(path)
            entry_dir = path if name.endswith("/") else folders[len(indent)]
            if name.endswith("/"):
                folders[len(indent) + 2] = path
        for name in PY_FILE.findall(description or ""):
            paths.append(PACKAGE / name if "/" in name else entry_dir / name)
    return paths


def test_the_layout_names_only_files_and_folders_that_exist():
    paths = layout_paths()
    assert PACKAGE / "cli" / "train.py" in paths and PACKAGE / "run" / "lifecycle.py" in paths
    missing = [str(path.relative_to(ROOT)) for path in paths if not path.exists()]
    assert not missing, f"docs/development.md's Layout names what is not there: {missing}"


def test_one_run_names_the_files_it_counts_and_they_exist():
    text = DEVELOPMENT.read_text(encoding="utf-8")
    section = text.split("### One run, file by file", 1)[1].split("\n### ", 1)[0]
    stated = COUNTS[re.search(r"goes through (\w+) files", section).group(1)]
    steps = re.findall(r"^\d+\. (.*(?:\n {3}.*)*)", section, re.MULTILINE)
    files = [BACKTICKED_PY.findall(step) for step in steps]
    assert all(len(named) == 1 for named in files), files  # one file a step, named once
    assert len({named[0] for named in files}) == len(steps) == stated <= 8
    missing = [name for name in BACKTICKED_PY.findall(section) if not (PACKAGE / name).exists()]
    assert not missing, f"docs/development.md's run map names what is not there: {missing}"
