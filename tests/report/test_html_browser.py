"""The HTML report in a real browser: headless Chromium renders the graph SVG, the tables and the
charts, the page's script runs without an error, and a screenshot is saved.

Chromium and Graphviz come from the project's own set-up (``make browser-tools``, which ``make
test`` runs first); this test runs that target itself when Chromium is missing, and skips, saying
so, only where there is no apt-get to install it with.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
TIMEOUT_S = 120


def _find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def chromium() -> str:
    found = _find_chromium()
    if found is None and shutil.which("make") and shutil.which("apt-get"):
        subprocess.run(["make", "-C", str(ROOT), "browser-tools"], capture_output=True, text=True, timeout=900)
        found = _find_chromium()
    if found is None:
        if shutil.which("apt-get") is None:
            pytest.skip("no chromium and no apt-get to install it (make browser-tools): the HTML report's "
                        "browser test cannot run here")
        pytest.fail("make browser-tools did not install chromium although apt-get is there")
    return found


def _opfuse(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opfuse", *argv], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env=dict(os.environ))


def load_page(chromium: str, page: Path, tmp: Path) -> tuple[str, list[str]]:
    """(the DOM after the page's scripts ran, the console errors logged)."""
    r = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr",
                        "--v=0", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                       capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if "CONSOLE" in line and
              re.search(r"Uncaught|Error", line)]
    return r.stdout, errors


def screenshot(chromium: str, page: Path, png: Path, tmp: Path, size: str = "1400,2000") -> None:
    r = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'profile'}", f"--window-size={size}",
                        f"--screenshot={png}", page.as_uri()], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0 and png.exists(), r.stderr[-2000:]


def test_console_check_sees_a_script_error(chromium, tmp_path):
    page = tmp_path / "broken.html"
    page.write_text("<html><body><p>x</p><script>no_such_function();</script></body></html>")
    _, errors = load_page(chromium, page, tmp_path)
    assert errors and "no_such_function" in errors[0]


@pytest.mark.parametrize("layout", ["auto", "svg"])
def test_html_report_renders_in_chromium(chromium, tmp_path, layout):
    page = tmp_path / "report.html"
    r = _opfuse("compile", "zoo:resnet8", "--html", str(page), "--layout", layout, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    html = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "the report fetches nothing"

    dom, errors = load_page(chromium, page, tmp_path)
    assert errors == []
    assert 'data-opfuse-ready="ok"' in dom, "the page's script ran to its end"
    graph = re.search(r'<svg class="graph".*?</svg>', dom, re.S)
    assert graph and graph.group(0).count("<text") >= 30, "every op of the graph is drawn"
    assert "cluster" in graph.group(0), "fusion groups are drawn as clusters"
    groups = re.search(r'<table id="groups".*?</table>', dom, re.S)
    assert groups and groups.group(0).count("<tr>") == 1 + 13, "a header and one row per group"
    assert dom.count('class="kernel"') >= 10, "kernels on the roofline"
    assert 'class="live"' in dom, "the arena timeline"
    decisions = re.search(r'<table id="decisions".*?</table>', dom, re.S)
    assert decisions and "category forbids" in decisions.group(0), "refusals with their reasons"

    png = tmp_path / f"report-{layout}.png"
    screenshot(chromium, page, png, tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    out = os.environ.get("OPFUSE_SCREENSHOT_DIR")
    if out:  # keep the screenshot for a person to look at
        shutil.copy(png, Path(out) / png.name)
