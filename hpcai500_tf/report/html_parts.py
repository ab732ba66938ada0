"""The HTML pieces every report page is made of: the page itself (inline style, a content
security policy that lets it fetch nothing), sections, tables, "missing: ..." notes, figures,
and the table of a record's nine layers. Every text from a record is escaped here."""

from __future__ import annotations

import html

from hpcai500_tf.report.console import LAYER_NAMES
from hpcai500_tf.report.text import printable

INDEX = "index.html"  # the ranking page, which every other page links back to
POLICY = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
STYLE = """
body { margin: 0; color: #1f2328; background: #fff;
  font: 15px/1.45 system-ui, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
main { max-width: 1100px; margin: 0 auto; padding: 20px 32px 40px; }
h1 { font-size: 1.55em; margin: 0.2em 0; overflow-wrap: anywhere; }
h2 { font-size: 1.2em; margin: 1.6em 0 0.5em; padding-bottom: 3px; border-bottom: 1px solid #d0d7de;
  break-after: avoid; }
nav, .meta, footer { color: #57606a; font-size: 0.92em; }
nav a { margin-right: 0.9em; }
code { overflow-wrap: anywhere; }
table { border-collapse: collapse; width: 100%; margin: 0.4em 0; }
th, td { text-align: left; vertical-align: top; padding: 4px 8px; border-bottom: 1px solid #eaeef2;
  overflow-wrap: anywhere; }
thead th { background: #f6f8fa; }
table.words th, table.words td { overflow-wrap: normal; }  /* columns wide enough for words */
tr { break-inside: avoid; }
.card th { width: 13em; font-weight: 600; }
.layers td:first-child { width: 13em; } .layers td:nth-child(2) { width: 16em; }
.headline { font-size: 1.3em; font-weight: 700; color: #1a7f37; }
.missing, .not-scored, .refused { padding: 6px 12px; margin: 0.5em 0; border-left: 4px solid; }
.missing { background: #fff8c5; border-color: #d4a72c; }
.not-scored, .refused { background: #ffebe9; border-color: #cf222e; }
.flags { color: #9a6700; font-size: 0.88em; }
ul { margin: 0.3em 0; padding-left: 1.4em; }
figure { margin: 0.6em 0; break-inside: avoid; page-break-inside: avoid; }
figcaption { color: #57606a; font-size: 0.9em; }
svg { display: block; width: 100%; height: auto; }
@media print {
  @page { size: A4; margin: 12mm; }
  body { font-size: 10pt; }
  main { max-width: none; padding: 0; }
  nav { display: none; }
  a { color: inherit; text-decoration: none; }
  section { break-before: auto; }
}
"""


def escape(value) -> str:
    """Any value as HTML text: records, paths and sensor names are user input."""
    return html.escape(printable(value), quote=True)


def document(title: str, body: str, style: str = "", script: str = "") -> str:
    """A whole page: the shared style and `style`, `body` in <main>, `script` inline at the
    end. The content security policy lets the page load nothing: no file, no address, no
    font; only its own inline style, inline script and data: images."""
    script = f"<script>{script}</script>\n" if script else ""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n<style>{STYLE}{style}</style>\n</head>\n"
        f"<body>\n<main>\n{body}\n</main>\n{script}</body>\n</html>\n"
    )


def section(anchor: str, title: str, *parts: str) -> str:
    return (
        f'<section id="{escape(anchor)}">\n<h2>{escape(title)}</h2>\n'
        + "\n".join(parts)
        + "</section>\n"
    )


def missing(notes: list[str]) -> str:
    """The visible "missing: ..." notes of a section."""
    return "".join(f'<p class="missing">missing: {escape(note)}</p>\n' for note in notes)


def card(rows: list[tuple[str, str]]) -> str:
    """Label-value rows; values are HTML already (escaped where they hold record text)."""
    body = "".join(f"<tr><th>{escape(label)}</th><td>{value}</td></tr>\n" for label, value in rows)
    return f'<table class="card">\n{body}</table>\n'


def table(head: list[str], rows: list[list[str]], css_class: str = "") -> str:
    """A table with a header; cells are HTML already."""
    header = "".join(f"<th>{escape(cell)}</th>" for cell in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>\n" for row in rows)
    opening = f'<table class="{css_class}">' if css_class else "<table>"
    return f"{opening}\n<thead><tr>{header}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>\n"


def bullets(items: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{escape(item)}</li>" for item in items) + "</ul>"


def figure(svg: str, caption: str = "") -> str:
    caption = f"<figcaption>{caption}</figcaption>" if caption else ""
    return f"<figure>\n{svg}\n{caption}</figure>\n"


def _layer_value(value) -> str:
    if value is None:
        return "not observed"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "-"
    if isinstance(value, int) and not isinstance(value, bool) and value > 1 << 30:
        return f"{value / (1 << 30):.1f} GiB"
    return str(value)


def layers_section(record: dict, title: str = "The nine layers") -> str:
    """A record's nine layers, field by field."""
    rows = []
    for layer, name in LAYER_NAMES.items():
        fields = record["layers"][layer] or {"": "nothing recorded"}
        label = f"<b>{layer}</b> {escape(name)}"
        for index, (key, value) in enumerate(fields.items()):
            rows.append([label if index == 0 else "", escape(key), escape(_layer_value(value))])
    return section("layers", title, table(["Layer", "Field", "Value"], rows, "layers"))
