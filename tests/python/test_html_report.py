"""`crashcap report --html` in a real browser: Debian's chromium, headless, with the network
disabled. The page must render from the file alone (no request leaves it), print nothing to the
console, plot one loss point per recorded step, and draw a screenshot that is not blank. The
Markdown written beside it links it, and `pack --zip` puts both in the zip."""

import os
import re
import shutil
import subprocess

import pytest
from PIL import Image

from conftest import BIN, crashcap, crashcap_json, only_bundle

CHROMIUM = shutil.which("chromium")


def chromium(tmp_path, *args):
    """Headless chromium with no network: every host name fails to resolve and every request goes
    to a proxy that is not there. Its own profile directory, so that parallel tests do not meet."""
    if CHROMIUM is None:
        raise AssertionError("chromium is not installed (./dev setup installs Debian's chromium)")
    profile = tmp_path / f"profile-{len(os.listdir(tmp_path))}"
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            f"--user-data-dir={profile}", "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
            "--enable-logging=stderr", "--v=0", "--hide-scrollbars", *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180)


def console_lines(stderr):
    """What the page printed to its console (chromium logs each message as CONSOLE)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.fixture(scope="module")
def crash(tmp_path_factory):
    """A classifier whose batch at step 9 carries a NaN image in row 2: 10 recorded steps."""
    d = tmp_path_factory.mktemp("crash")
    r = subprocess.run([os.path.join(BIN, "crashcap-sample-cls"), "--steps", "14", "--record", str(d), "--fault",
                        "nan-sample", "--fault-step", "9", "--fault-row", "2", "--keyframe-every", "4"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    return only_bundle(d)


def test_the_html_report_renders_offline_with_a_point_per_recorded_step(crash, tmp_path):
    page = tmp_path / "report.html"
    crashcap("report", crash, "--html", "-o", page, "--no-triage", check=True)
    html = page.read_text()
    # Self-contained: nothing to fetch, whatever the browser.
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I), "the page refers to the network"
    assert "<link" not in html and "@import" not in html
    assert "Chart.js v" in html, "the chart library is embedded"

    r = chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", page.as_uri())
    assert r.returncode == 0, r.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", r.stdout)
    assert body, r.stdout[:2000]
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1)))
    assert attrs.get("rendered") == "true", f"the page's script did not finish: {attrs}; console: {console_lines(r.stderr)}"
    assert console_lines(r.stderr) == [], console_lines(r.stderr)
    story = crashcap_json("inspect", crash)
    # A point for every step whose loss was recorded: step 9's NaN too, which ended but never completed.
    ended = story["steps"]["ended"]
    assert ended == 10 and story["steps"]["completed"] == 9 and story["crash"]["step"] == 9, story["steps"]
    assert int(attrs["loss-points"]) == ended
    # The culprit row (2) beside a normal row, as pictures: image-like rows of the crash step.
    assert int(attrs["pictures"]) >= 2
    assert "2 (culprit)" in r.stdout and "(normal)" in r.stdout

    shot = tmp_path / "report.png"
    r = chromium(tmp_path, "--virtual-time-budget=10000", "--window-size=1200,1600", f"--screenshot={shot}", page.as_uri())
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "the screenshot is blank or nearly so"
    # The plots are drawn: the line colour of the curves is on the page.
    assert any(abs(c[0] - 0x15) < 24 and abs(c[1] - 0x65) < 24 and abs(c[2] - 0xc0) < 24 for _, c in colours)


def test_the_markdown_links_the_html_and_the_zip_holds_both(crash, tmp_path):
    md, page = tmp_path / "bug.md", tmp_path / "bug.html"
    crashcap("report", crash, "-o", md, "--html-out", page, "--no-triage", check=True)
    assert "[bug.html](bug.html)" in md.read_text()
    assert page.read_text().startswith("<!DOCTYPE html>")

    attach = tmp_path / "attach.zip"
    p = crashcap_json("pack", crash, "-o", attach, "--zip")
    assert p["zip_entries"] == ["attach.ccap", "report.md", "report.html"], p
    out = tmp_path / "unzipped"
    subprocess.run(["/usr/bin/python3", "-m", "zipfile", "-e", str(attach), str(out)], check=True)
    r = chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", (out / "report.html").as_uri())
    assert 'data-rendered="true"' in r.stdout, console_lines(r.stderr)
    assert console_lines(r.stderr) == []
    # The packed bundle holds the crash step alone: one point.
    assert 'data-loss-points="1"' in r.stdout


def test_a_bundle_without_a_crash_step_still_gets_a_page(tmp_path):
    """A training killed before its first step was recorded: no steps, no batch, still a page."""
    r = subprocess.run([os.path.join(BIN, "crashcap-test-victim"), "--dir", str(tmp_path / "v"), "--fail", "setup"],
                       capture_output=True, text=True, timeout=120)
    bundles = [f for f in os.listdir(tmp_path / "v") if f.endswith(".ccap")]
    assert bundles, r.stdout + r.stderr
    page = tmp_path / "setup.html"
    crashcap("report", tmp_path / "v" / bundles[0], "--html", "-o", page, "--no-triage", check=True)
    r = chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", page.as_uri())
    assert 'data-rendered="true"' in r.stdout, console_lines(r.stderr)
    assert 'data-loss-points="0"' in r.stdout
    assert console_lines(r.stderr) == []
