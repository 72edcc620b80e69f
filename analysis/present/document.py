"""The report as a document: a list of blocks (headings, paragraphs, bullet lists, tables, figures, folded
details) rendered twice, as one self-contained HTML page and as Markdown, so the two can never disagree.

The HTML embeds its figures as base64 PNG and its CSS inline: it can be mailed or attached to an issue and still
open offline. Every string that comes from a run (config values, names, paths, error messages) is free text, so
it is escaped: HTML-escaped in the page, Markdown-escaped (not HTML-escaped) in report.md.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from typing import Any

from analysis.present.style import PlotFigure

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;
 padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}h3{margin-top:1.5em}
.scroll{overflow-x:auto;max-width:100%}table{border-collapse:collapse;font-size:.85em;margin:.8em 0}
th,td{border:1px solid #ddd;padding:.3em .55em;text-align:left;vertical-align:top}
td{max-width:32em;overflow-wrap:break-word}p,li,summary,figcaption{overflow-wrap:anywhere}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}
td.num{text-align:right;white-space:nowrap;max-width:none}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#555}
code{background:#f3f3f3;padding:0 .2em}
"""


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Para:
    text: str


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    numeric: frozenset[int] = frozenset()  # column indexes right-aligned in HTML


@dataclass
class Fig:
    figure: PlotFigure
    file_name: str  # the PNG next to report.md


@dataclass
class Details:
    summary: str
    blocks: list[Block]


Block = Heading | Para | Bullets | Table | Fig | Details


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def render_html(blocks: list[Block], title: str) -> str:
    body = "\n".join(_html_block(b) for b in blocks)
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{_e(title)}</title>\n'
        f"<style>{CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def _html_block(b: Block) -> str:
    if isinstance(b, Heading):
        return f"<h{b.level}>{_e(b.text)}</h{b.level}>"
    if isinstance(b, Para):
        return f"<p>{_e(b.text)}</p>"
    if isinstance(b, Bullets):
        return "<ul>" + "".join(f"<li>{_e(i)}</li>" for i in b.items) + "</ul>"
    if isinstance(b, Table):
        head = "".join(f"<th>{_e(h)}</th>" for h in b.headers)
        cell = ('<td class="num">', "<td>")
        rows = "".join(
            "<tr>" + "".join(f"{cell[i not in b.numeric]}{_e(c)}</td>" for i, c in enumerate(r)) + "</tr>"
            for r in b.rows
        )
        return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>'
    if isinstance(b, Fig):
        data = base64.b64encode(b.figure.png).decode("ascii")
        return (
            f'<figure><img alt="{_e(b.figure.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_e(b.figure.caption)}</figcaption></figure>"
        )
    if isinstance(b, Details):
        inner = "\n".join(_html_block(x) for x in b.blocks)
        return f"<details><summary>{_e(b.summary)}</summary>\n{inner}\n</details>"
    raise TypeError(f"unknown block {type(b).__name__}")


MD_ALWAYS = re.compile(r"([\\`*|~])")  # backslash, code span, emphasis, table cell, strikethrough
MD_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")  # emphasis; an intraword _ is literal
MD_TAG = re.compile(r"<(?=[A-Za-z/!?])[^<>]*>?")  # what a Markdown renderer would pass through as raw HTML
MD_ENTITY = re.compile(r"&(?=#?[A-Za-z0-9]+;)")  # an & that would start an entity reference
MD_LINK = re.compile(r"\](?=[(\[])")  # the ] of a link or an image, [text](url)
MD_BRACKET = re.compile(r"[\[\]]")
MD_BLOCK_START = re.compile(r"^(?:[#>]|[+-](?=[ -]|$)|\d+[.)](?= |$))")  # heading, quote, list, rule


def md_text(s: Any, block_start: bool = False, alt: bool = False) -> str:
    """Text as Markdown that renders as exactly ``s`` (whitespace collapsed), not HTML-escaped: a backslash
    before each character that would start Markdown syntax (emphasis, code, a table cell, a link; with
    ``block_start``, text that opens a paragraph or list item, a heading, quote or list marker), and character
    references only where a renderer would otherwise pass raw HTML through (``<tag ...>``) or decode one
    (``&amp;``); with ``alt`` (an image's alt text, inside ``![...]``) every bracket. Run names and errors are
    free text: markup in them is shown, never interpreted."""
    text = " ".join(str(s).split())
    text = MD_ALWAYS.sub(r"\\\1", text)
    text = MD_UNDERSCORE.sub(r"\\_", text)
    text = MD_ENTITY.sub("&amp;", text)
    text = MD_TAG.sub(lambda m: m.group(0).replace("<", "&lt;").replace(">", "&gt;"), text)
    text = (MD_BRACKET if alt else MD_LINK).sub(r"\\\g<0>", text)
    if block_start and (m := MD_BLOCK_START.match(text)):
        text = text[: m.end() - 1] + "\\" + text[m.end() - 1 :]
    return text


def render_markdown(blocks: list[Block]) -> str:
    parts: list[str] = []
    for b in blocks:
        parts.append(_md_block(b))
    return "\n\n".join(parts) + "\n"


def _md_block(b: Block) -> str:
    if isinstance(b, Heading):
        return "#" * b.level + " " + md_text(b.text)
    if isinstance(b, Para):
        return md_text(b.text, block_start=True)
    if isinstance(b, Bullets):
        return "\n".join(f"- {md_text(i, block_start=True)}" for i in b.items)
    if isinstance(b, Table):
        lines = ["| " + " | ".join(md_text(h) for h in b.headers) + " |"]
        lines.append("|" + "|".join("---:" if i in b.numeric else "---" for i in range(len(b.headers))) + "|")
        lines += ["| " + " | ".join(md_text(c) for c in r) + " |" for r in b.rows]
        return "\n".join(lines)
    if isinstance(b, Fig):
        return f"![{md_text(b.figure.title, alt=True)}]({b.file_name})\n\n_{md_text(b.figure.caption)}_"
    if isinstance(b, Details):
        return "\n\n".join([f"**{md_text(b.summary)}**", *(_md_block(x) for x in b.blocks)])
    raise TypeError(f"unknown block {type(b).__name__}")


def figures_in(blocks: list[Block]) -> list[Fig]:
    """Every figure of the document, those inside Details included, in document order."""
    out: list[Fig] = []
    for b in blocks:
        if isinstance(b, Fig):
            out.append(b)
        elif isinstance(b, Details):
            out += figures_in(b.blocks)
    return out
