"""The HTML report as a user sees it: headless Chromium loads `kernel-pytorch analyze --html` of the
built-in tiny Llama with no console message, every chart decodes, and a full-page screenshot shows each
section's heading and its rule where the page lays them out. Skips only where no Chromium is installed
(.ci/run installs Debian's `chromium`)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kernel_pytorch.assistant.findings import SECTION_TITLES
from kernel_pytorch.cli.main import main

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian's chromium package)")

HEADINGS = ["Summary", *SECTION_TITLES.values()]
WIDTH = 1280
RULE = (221, 221, 221)  # h2's border-bottom colour (#ddd) in html_report's style sheet
# Appended to a copy of the page (the page itself has no script): what the browser laid out and decoded
PROBE = """<script>
const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top + scrollY, r.width, r.height]; };
console.log("KP-PROBE " + JSON.stringify({
  images: [...document.images].map(i => ({alt: i.alt, decoded: i.complete && i.naturalWidth > 0, box: box(i)})),
  svgs: [...document.querySelectorAll("svg")].map(box),
  headings: [...document.querySelectorAll("h2")].map(h => ({text: h.textContent, box: box(h)})),
  height: document.documentElement.scrollHeight,
}));
</script>"""


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium as root in a closed network: no sandbox, GPU or background connections, a fresh
    profile; the page's console messages come on stderr as `CONSOLE` lines."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
             "--force-device-scale-factor=1", f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr",
             "--v=0"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120, check=True)


def _console(run: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in run.stderr.splitlines() if ":CONSOLE" in line]


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    assert main(["analyze", "-q", "--html", str(out / "report.html")]) == 0
    return out / "report.html"


def test_page_loads_with_no_console_message(page: Path) -> None:
    run = _chromium(page.parent, "--dump-dom", page.as_uri())
    assert _console(run) == []
    dom = run.stdout
    for heading in HEADINGS:
        assert f">{heading}</h2>" in dom
    assert "<script" not in dom


def test_screenshot_shows_every_section_and_chart(page: Path) -> None:
    np = pytest.importorskip("numpy")
    image = pytest.importorskip("PIL.Image")
    probe = page.with_name("probe.html")
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    (line,) = _console(_chromium(page.parent, f"--window-size={WIDTH},900", "--dump-dom", probe.as_uri()))
    laid = json.loads(line.split("KP-PROBE ", 1)[1].rsplit('", source:', 1)[0])
    assert [h["text"] for h in laid["headings"]] == HEADINGS
    assert laid["images"] or laid["svgs"], "the kernel section draws its charts"
    assert all(i["decoded"] for i in laid["images"]), laid["images"]
    assert all(w > 0 and h > 0 for _, _, w, h in laid["svgs"])

    shot = page.with_name("report.png")
    _chromium(page.parent, f"--window-size={WIDTH},{laid['height']}", f"--screenshot={shot}", page.as_uri())
    pixels = np.asarray(image.open(shot).convert("RGB")).astype(int)
    assert pixels.shape[:2] == (laid["height"], WIDTH)
    for h in laid["headings"]:
        left, top, width, height = (round(v) for v in h["box"])
        bottom = top + height
        # the 2 px border ends the box; a row either side for sub-pixel layout
        rule = np.abs(pixels[bottom - 3:bottom + 1, left:left + width] - RULE).max(-1) <= 2
        assert rule.mean(-1).max() > 0.9, f"no rule under {h['text']!r} at y={bottom - 2}"
        text = pixels[top:bottom - 2, left:left + width]
        assert (text.max(-1) < 128).sum() > 50, f"no heading text drawn for {h['text']!r}"
    for left, top, width, height in [i["box"] for i in laid["images"]] + laid["svgs"]:
        left, top, width, height = round(left), round(top), round(width), round(height)
        chart = pixels[top:top + height, left:left + width].reshape(-1, 3)
        assert len(np.unique(chart, axis=0)) > 8, "a chart drew as a blank area"
