"""The report as one self-contained HTML file: summary, every section's findings, a roofline chart and
a kernel-time breakdown (`charts`), styles inline, no script, no network resource. It carries the
same findings as the Markdown and JSON renderings (`render`), section by section, whatever sections
the report has."""

from __future__ import annotations

import html
import re

from kernel_pytorch.assistant.findings import SECTION_TITLES, Finding, Location, Report
from kernel_pytorch.assistant.report.charts import chart_images
from kernel_pytorch.assistant.report.render import _headline_text, _joined, _ran, _where

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1080px;color:#222;
line-height:1.45;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
table.meta{border-collapse:collapse;margin:.6em 0}table.meta td,table.meta th{border:1px solid #ddd;
padding:.25em .6em;text-align:left;font-size:.92em}
.headline{font-weight:bold;background:#f4f6fa;padding:.6em .8em;border-radius:6px}
.finding{border-left:5px solid #999;background:#fafafa;margin:.7em 0;padding:.5em .9em;border-radius:4px}
.finding.error{border-color:#c0392b}.finding.warning{border-color:#e0a800}.finding.info{border-color:#2e86c1}
.sev{font-size:.75em;font-weight:bold;text-transform:uppercase;padding:.1em .45em;border-radius:3px;color:#fff;
margin-right:.5em}.sev.error{background:#c0392b}.sev.warning{background:#c99700}.sev.info{background:#2e86c1}
.title{font-weight:600}.k{color:#666;font-size:.88em;margin-right:.4em}
.row{margin:.2em 0;font-size:.93em}code{background:#eef;padding:0 .25em;border-radius:3px;font-size:.92em}
.where code{background:#f3eef8}.id{color:#888;font-size:.8em}.empty{color:#888;font-style:italic}
.chart{margin:.8em 0;overflow-x:auto}ol.sugg li{margin:.3em 0}
"""


def _inline(text: str) -> str:
    """Escaped text with `code` spans kept as <code>."""
    parts = re.split(r"`([^`]+)`", text)
    return "".join(html.escape(p) if i % 2 == 0 else f"<code>{html.escape(p)}</code>" for i, p in enumerate(parts))


def _place(loc: Location) -> str:
    code = f" <code>{html.escape(loc.code)}</code>" if loc.code else ""
    return f"<code>{html.escape(_where(loc))}</code>{code}"


def _finding(f: Finding) -> str:
    sev = f.severity.value
    rows = [f'<div><span class="sev {sev}">{sev}</span><span class="title">{_inline(f.title)}</span></div>']
    places = _joined(f, _place)
    if places:
        rows.append(f'<div class="row where"><span class="k">where</span>{places}</div>')
    for label, text in (("evidence", f.evidence), ("fix", f.suggestion), ("gain", f.estimated_gain)):
        if text:
            rows.append(f'<div class="row"><span class="k">{label}</span>{_inline(text)}</div>')
    rows.append(f'<div class="id">{html.escape(f.id)}</div>')
    return f'<div class="finding {sev}">' + "".join(rows) + "</div>"


def _meta_table(report: Report) -> str:
    m = report.meta
    seconds = (m.get("seconds") or {}).get("total")
    cells = {"device": m.get("device"), "dtype": m.get("dtype"), "torch": m.get("torch"),
             "backend": m.get("backend"), "mode": m.get("mode") or "default",
             "inputs": ", ".join(f"{k}: {v}" for k, v in (m.get("inputs") or {}).items()),
             "analysis time": f"{seconds:.1f} s" if seconds is not None else ""}
    head = "".join(f"<th>{html.escape(k)}</th>" for k in cells)
    body = "".join(f"<td>{html.escape(str(v if v is not None else ''))}</td>" for v in cells.values())
    return f'<table class="meta"><tr>{head}</tr><tr>{body}</tr></table>'


def _summary(report: Report, top: int = 5) -> str:
    out = [f'<p class="headline">{html.escape(_headline_text(report))}</p>']
    verdict = next((f for f in report.kernel_efficiency if f.id == "verdict.compile"), None)
    if verdict is not None:
        out.append(f"<p><b>Compile verdict:</b> {_inline(verdict.title)}</p>")
    sugg = report.optimization_suggestions[:top]
    if sugg:
        items = "".join(f"<li>{_inline(s.title.split(': ', 1)[-1])}: {_inline(s.suggestion)} "
                        f"<span class='k'>{_inline(s.estimated_gain or '')}</span></li>" for s in sugg)
        out.append(f'<p><b>Top suggestions</b></p><ol class="sugg">{items}</ol>')
    return "".join(out)


def to_html(report: Report, charts: str = "auto") -> str:
    """The report as one HTML document (see the module docstring).

    Args:
        report: any Report; every section is shown, empty and not-run ones say so.
        charts: "auto" (PNG via matplotlib when installed, else inline SVG), "svg" or "png".
    """
    images = chart_images(report, prefer=charts)
    body = [f"<h1>Compile report: {html.escape(report.model)}</h1>", _meta_table(report), "<h2>Summary</h2>",
            _summary(report)]
    for name, findings in report.sections():
        body.append(f'<h2 id="{name}">{html.escape(SECTION_TITLES.get(name, name))}</h2>')
        if name == "kernel_efficiency" and images:
            body.append('<h3>Kernel time per step</h3><div class="chart">' + images["breakdown"] + "</div>")
            body.append('<h3>Roofline</h3><div class="chart">' + images["roofline"] + "</div>")
        if not findings:
            text = "No findings." if _ran(report, name) else "Not analysed (not among the sections run)."
            body.append(f'<p class="empty">{text}</p>')
        body.extend(_finding(f) for f in findings)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>Compile report: {html.escape(report.model)}</title><style>{_CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


__all__ = ["to_html"]
