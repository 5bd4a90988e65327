"""A small document model for the report: headings, paragraphs, tables, code and images, rendered as Markdown and as a
self-contained HTML page (images inline)."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ReportDocument:
    """Blocks rendered both as Markdown and as HTML, so the two reports always say the same thing."""

    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("heading", (level, text)))

    def paragraph(self, text: str) -> None:
        self.blocks.append(("paragraph", text))

    def table(self, header: list[str], rows: list[list[object]]) -> None:
        self.blocks.append(("table", (header, [[cell(v) for v in row] for row in rows])))

    def code(self, text: str) -> None:
        """Commands to copy: a fenced block in Markdown, <pre> in HTML."""
        self.blocks.append(("code", text))

    def image(self, path: Path, alt: str) -> None:
        self.blocks.append(("image", (path, alt)))

    def markdown(self, folder: Path) -> str:
        out = []
        for kind, value in self.blocks:
            if kind == "heading":
                out.append("#" * value[0] + " " + value[1])
            elif kind == "paragraph":
                out.append(value)
            elif kind == "code":
                out.append(f"```bash\n{value}\n```")
            elif kind == "table":
                header, rows = value
                lines = [
                    "| " + " | ".join(cell(h) for h in header) + " |",
                    "|" + "|".join("---" for _ in header) + "|",
                ]
                lines += ["| " + " | ".join(row) + " |" for row in rows]
                out.append("\n".join(lines))
            else:
                path, alt = value
                out.append(f"![{alt}]({path.relative_to(folder).as_posix()})")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        out = [
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
            "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
            "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;"
            "text-align:left;vertical-align:top}img{max-width:100%}</style></head><body>"
        ]
        for kind, value in self.blocks:
            if kind == "heading":
                out.append(f"<h{value[0]}>{html.escape(value[1])}</h{value[0]}>")
            elif kind == "paragraph":
                out.append(f"<p>{html.escape(value)}</p>")
            elif kind == "code":
                out.append(f"<pre>{html.escape(value)}</pre>")
            elif kind == "table":
                header, rows = value
                out.append(
                    "<table><tr>"
                    + "".join(f"<th>{html.escape(h)}</th>" for h in header)
                    + "</tr>"
                    + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
                    + "</table>"
                )
            else:
                path, alt = value
                data = base64.b64encode(path.read_bytes()).decode()
                out.append(f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{data}'>")
        return "\n".join(out) + "</body></html>\n"


def cell(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value).replace("|", "\\|").replace("\n", " ")
