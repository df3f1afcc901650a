"""A report as one self-contained HTML file: the figures as inline SVG (drawn by matplotlib, text kept as
text), the tables as HTML tables whose cells say which figure of which file they show, no script and
nothing loaded at view time (a Content-Security-Policy forbids it).

Every string from a trace, a server or a result file goes through Jinja's autoescape; the SVG is the
only markup let through as is, and matplotlib escapes the text it writes into it."""

from __future__ import annotations

import datetime as _dt
import io
import re
from pathlib import Path

import jinja2
import matplotlib
from markupsafe import Markup

from .. import __version__
from . import plots
from .page import Chart, Report

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("simulator.report", "templates"),
                          autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=False)
_SVG_SIZE = re.compile(r'(<svg\b[^>]*?)\s(?:width|height)="[^"]*"')
_SVG_WIDTH = re.compile(r'<svg\b[^>]*?\swidth="([0-9.]+pt)"')


@plots.in_style
def svg_markup(chart: Chart, salt: str) -> Markup:
    """The chart as an inline <svg> element that scales to the page's width. `salt` keeps the ids
    matplotlib gives clip paths and markers apart between the figures of one page."""
    out = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt}):
        chart.figure.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
    text = out.getvalue()
    text = text[text.index("<svg"):]  # drop the XML declaration and doctype: not allowed inside HTML
    # no fixed size: the page scales the figure to its width, up to the size it was drawn at
    width = _SVG_WIDTH.search(text)
    for _ in range(2):
        text = _SVG_SIZE.sub(r"\1", text, count=1)
    style = f' style="max-width: {width.group(1)}"' if width else ""
    return Markup(text.replace("<svg", f'<svg role="img" aria-label="{Markup.escape(chart.title)}"{style}', 1))


def render_html(report: Report) -> str:
    """The report's page as HTML text."""
    svgs = {chart.name: svg_markup(chart, f"{report.kind}-{chart.name}") for chart in report.charts()}
    template = _ENV.get_template("report.html.j2")
    return template.render(report=report, svgs=svgs, version=__version__,
                           generated=_dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"))


def write_html(report: Report, path: Path) -> Path:
    """Write the report's page to `path` (its folder made when missing); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(report), encoding="utf-8")
    return path
