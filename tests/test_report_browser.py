"""Every kind of HTML report opened in a real headless Chromium (Debian's package), driven by
Playwright: the page logs no console error, requests nothing but itself, runs no script even with
hostile task ids and server messages, draws its figures, and the figures it shows, read from the DOM,
equal those of summary.json (or study.json). A screenshot of each page is taken (kept in
$AGENTLOAD_SCREENSHOTS when that is set).

Without Chromium or Playwright the tests are skipped, except under CI (``CI=true``), where that is a
failure: .ci/run installs both."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import report_folders as rf
from simulator.cli import main
from simulator.metrics import results

CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]
WIDTH = 1200


def chromium_path() -> str | None:
    return os.environ.get("AGENTLOAD_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser(request, tmp_path_factory):
    """A headless Chromium with its own profile folder, for the whole module (after the result folders
    are made: Playwright's synchronous API holds an event loop that a live run cannot share)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    executable = chromium_path()
    reason = ("playwright is not installed (pip install '.[test]')" if sync_playwright is None else
              "chromium not found (apt-get install chromium)" if executable is None else None)
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    request.getfixturevalue("folders")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=executable, headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": WIDTH, "height": 900})
        yield context
        context.close()


@pytest.fixture(scope="module")
def folders(report_runs, tmp_path_factory) -> dict[str, Path]:
    hostile = tmp_path_factory.mktemp("report-browser") / "hostile"
    shutil.copytree(report_runs["live"], hostile)
    rf.add_hostile_failures(hostile)
    return {**report_runs, "hostile": hostile}


class Opened:
    """A page as the browser showed it: console messages, requests, dialogs, the figure cells."""

    def __init__(self, context, path: Path, shot: Path) -> None:
        self.messages: list[tuple[str, str]] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        page = self.page = context.new_page()
        page.on("console", lambda m: self.messages.append((m.type, m.text)))
        page.on("pageerror", lambda e: self.messages.append(("pageerror", str(e))))
        page.on("request", lambda r: self.requests.append(r.url))
        page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        page.goto(path.resolve().as_uri(), wait_until="load")
        page.screenshot(path=str(shot), full_page=True)
        self.shot = shot
        keep = os.environ.get("AGENTLOAD_SCREENSHOTS")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, Path(keep) / shot.name)
        self.cells = page.eval_on_selector_all(
            "[data-source]", "els => els.map(e => ({source: e.dataset.source, folder: e.dataset.folder, "
            "value: e.dataset.value, scale: e.dataset.scale, text: e.innerText}))")
        self.figures = page.eval_on_selector_all(
            "figure", "els => els.map(e => { const r = e.querySelector('svg').getBoundingClientRect(); "
            "return {id: e.id, width: r.width, height: r.height}; })")

    def errors(self) -> list[tuple[str, str]]:
        return [m for m in self.messages if m[0] in ("error", "pageerror")]

    def close(self) -> None:
        self.page.close()


def report(argv: list[str], out: Path) -> Path:
    assert main([*argv, "--html", str(out)]) == 0
    return out


def check_page(opened: Opened, path: Path, documents: list, figures: int) -> None:
    """What every page must show: no console error, no request but itself, its figures drawn, every
    figure cell equal to its file, and a screenshot that is a picture of a page."""
    assert opened.errors() == []
    assert opened.requests == [path.resolve().as_uri()]
    assert len(opened.figures) == figures
    for fig in opened.figures:
        assert fig["width"] > 500 and fig["height"] > 150, fig
    assert rf.check_cells(opened.cells, documents) > 50
    image = __import__("matplotlib.image", fromlist=["imread"]).imread(opened.shot)
    assert image.shape[1] == WIDTH and image.shape[0] > 1500
    ink = (image[:, :, :3] < 0.9).any(axis=2).mean()
    assert 0.02 < ink < 0.6, ink  # text, lines and tables on a white page
    rgb = (image[:, :, :3] * 255).astype(np.uint32)
    assert np.unique(rgb[:, :, 0] << 16 | rgb[:, :, 1] << 8 | rgb[:, :, 2]).size > 50  # colours of the figures


def summaries(*folders: Path) -> list[dict]:
    return [json.loads((f / results.SUMMARY_FILE).read_text()) for f in folders]


def test_run_page_in_chromium(browser, folders, tmp_path):
    path = report(["report", str(folders["live"])], tmp_path / "run.html")
    opened = Opened(browser, path, tmp_path / "report-run.png")
    check_page(opened, path, summaries(folders["live"]), figures=4)
    p95 = opened.page.inner_text(".key:nth-child(4) .v")
    assert p95.endswith(" s") and opened.page.inner_text(".key:nth-child(4) .l") == "task time p95"
    opened.close()


def test_comparison_page_in_chromium(browser, folders, tmp_path):
    order = [folders["sim"], folders["live"], folders["other"]]
    path = report(["compare", *map(str, order)], tmp_path / "cmp.html")
    opened = Opened(browser, path, tmp_path / "report-comparison.png")
    check_page(opened, path, summaries(*order), figures=4)
    assert {c["folder"] for c in opened.cells} == {"0", "1", "2"}
    alerts = opened.page.eval_on_selector_all(".warning", "els => els.map(e => e.innerText)")
    assert len(alerts) == 1 and alerts[0].startswith("other replayed a different workload from sim")
    opened.close()


def test_study_page_in_chromium(browser, tmp_path):
    path = report(["report", str(rf.STUDY_FIXTURE)], tmp_path / "study.html")
    opened = Opened(browser, path, tmp_path / "report-study.png")
    check_page(opened, path, [json.loads((rf.STUDY_FIXTURE / "study.json").read_text())], figures=4)
    flags = opened.page.eval_on_selector_all("td.tone-bad", "els => els.map(e => e.innerText)")
    assert flags.count("CHANGED") == 2  # mtp3, in the ranking and in the quality table
    opened.close()


def test_hostile_page_runs_nothing_and_shows_the_strings(browser, folders, tmp_path):
    path = report(["report", str(folders["hostile"])], tmp_path / "hostile.html")
    opened = Opened(browser, path, tmp_path / "report-hostile.png")
    check_page(opened, path, summaries(folders["hostile"]), figures=4)
    page = opened.page
    assert opened.dialogs == []
    assert page.evaluate("document.querySelectorAll('script, img, iframe').length") == 0
    assert page.evaluate("[...document.querySelectorAll('*')].filter(e => [...e.attributes]"
                         ".some(a => a.name.startsWith('on'))).length") == 0
    text = page.inner_text("body")
    for raw in (rf.HOSTILE_CLASS, rf.QUOTED_CLASS, rf.HOSTILE_MESSAGE, "http_5xx<br>"):
        assert raw in text, raw
    opened.close()
