"""``allocsim report``: one self-contained page whose data agree with ``run``, tested in a real browser.

The browser tests drive Debian's ``chromium`` with ``chromedriver`` through selenium (``.ci/run``
installs all three); they skip, saying so, only where no browser can be started. The page is opened
from disk with every network request blocked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from allocsim.cli import main

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT.parent / "shared" / "traces" / "pytorch-snapshots"
OOM_STORY = "Maphsge4__snapshot.pickle"
SCREENSHOT = ROOT / "docs" / "report.png"


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def page_data(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S)
    assert m, "the page carries its data inline"
    return json.loads(m.group(1))


@pytest.mark.full
def test_page_is_self_contained_and_agrees_with_run(tmp_path, capsys):
    """No external resource; the verdict and peaks are those ``run --fast`` prints; categories add up."""
    trace = ROOT / "traces" / "bert_fp32.json.gz"
    out = tmp_path / "r.html"
    code, text, _ = run_cli(capsys, "report", trace, "--policy", "pytorch", "--policy", "cuda-async",
                            "--capacity", "2GiB", "--advise", "-o", out)
    assert code == 0 and out.is_file()
    html = out.read_text(encoding="utf-8")
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', html), "nothing may be fetched"
    assert "default-src 'none'" in html
    data = page_data(html)
    for run, policy in zip(data["runs"], ["pytorch", "cuda-async"]):
        code, printed, _ = run_cli(capsys, "run", trace, "--policy", policy, "--capacity", "2GiB", "--fast", "--json")
        summary = json.loads(printed)
        code_text, printed_text, _ = run_cli(capsys, "run", trace, "--policy", policy, "--capacity", "2GiB", "--fast")
        assert run["verdict"] == printed_text.rstrip("\n").rpartition("\n")[2]
        assert run["peak_reserved_bytes"] == summary["peak_reserved_bytes"]
        assert run["categories"]["at_peak"] == summary["categories"]["at_peak"]
        assert sum(run["categories"]["at_peak"].values()) == summary["peak_requested_bytes"]
        assert f"{policy}: {run['verdict']}" in text
    # --advise: the recommendations and their paste-ready lines are advise's own.
    code, printed, _ = run_cli(capsys, "advise", trace, "--capacity", "2GiB", "--fast", "--json")
    advice = json.loads(printed)
    assert [r["line"] for r in data["advice"]["recommendations"]] == [r["line"] for r in advice["recommendations"]]
    assert data["advice"]["recommendations"] and data["advice_text"].startswith("allocsim advise:")
    # The timeline keeps the peak: its per-bucket maxima reach the runs' peaks exactly.
    tl = data["timelines"]
    assert max(tl["runs"][0]["reserved_bytes"]) == data["runs"][0]["peak_reserved_bytes"]
    assert len(tl["x"]) <= 8192


@pytest.mark.shared
def test_segment_map_blocks_name_their_allocation(shared_dir, tmp_path, capsys):
    """Each live block of the map at the reserved peak points at an allocation with its category and stack."""
    out = tmp_path / "r.html"
    code, _, _ = run_cli(capsys, "report", SNAPSHOTS / OOM_STORY, "--capacity", "20GiB", "-o", out)
    assert code == 0
    data = page_data(out.read_text(encoding="utf-8"))
    run = data["runs"][0]
    peak = run["maps"]["peak_reserved"]
    states = data["states"]
    live = [p for p in peak["pieces"] if states[p[3]] == "requested"]
    assert live and all(p[4] >= 0 for p in live)
    # The map's segments add up to the run's peak reserved bytes.
    assert sum(s[1] for s in peak["segments"]) == run["peak_reserved_bytes"]
    with_stack = [data["allocs"][p[4]] for p in live if data["allocs"][p[4]][5] >= 0]
    assert with_stack and all(data["frames"][data["stacks"][a[5]][0]] for a in with_stack)
    assert {data["categories"][a[2]] for a in with_stack} <= set(data["categories"])


def test_report_bad_input_is_one_line(tmp_path, capsys):
    code, _, err = run_cli(capsys, "report", tmp_path / "missing.pickle", "-o", tmp_path / "r.html")
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("allocsim report: error:")
    code, _, err = run_cli(capsys, "report", ROOT / "traces" / "bert_fp32.json.gz", "-o", tmp_path / "no" / "r.html")
    assert code == 2 and "does not exist" in err


@pytest.mark.shared
def test_report_of_a_state_only_snapshot_says_what_to_run(shared_dir, tmp_path, capsys):
    path = shared_dir / "traces" / "state-only-snapshots" / "volcengine_verl_mem.pickle"
    code, _, err = run_cli(capsys, "report", path, "-o", tmp_path / "r.html")
    assert code == 2 and "records the final state only" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


# ----------------------------------------------------------------------------- in a real browser
def _chrome():
    """A headless Chromium with its network blocked, or a skip that says why none could be started."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install selenium; .ci/run installs it)")
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip("no chromium/chromedriver (apt-get install chromium chromium-driver; .ci/run installs them)")
    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
                "--disable-component-update", "--disable-sync", "--window-size=1400,2400",
                "--host-resolver-rules=MAP * ~NOTFOUND"):
        opts.add_argument(arg)
    opts.binary_location = binary
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        browser = webdriver.Chrome(service=Service(driver), options=opts)
    except Exception as exc:   # noqa: BLE001 - any failure to start is "no browser here"
        pytest.skip(f"chromium could not be started: {str(exc).splitlines()[0]}")
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["http://*", "https://*", "ws://*", "wss://*"]})
    return browser


@pytest.fixture(scope="module")
def browser():
    driver = _chrome()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def oom_report(tmp_path_factory):
    if not SNAPSHOTS.is_dir():
        pytest.skip("shared data folder is absent (real traces live there)")
    out = tmp_path_factory.mktemp("report") / "report.html"
    proc = subprocess.run([sys.executable, "-m", "allocsim", "report", str(SNAPSHOTS / OOM_STORY), "--policy", "pytorch",
                           "--policy", "pytorch:expandable_segments:True", "--capacity", "20GiB", "-o", str(out)],
                          capture_output=True, text=True, timeout=600, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.full
@pytest.mark.shared
def test_page_in_chromium(browser, oom_report, capsys):
    """Opened from disk, offline: no console error, the verdicts are run's, hovering a block shows its stack."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    browser.get(oom_report.as_uri())
    assert browser.execute_script("return document.body.dataset.ready") == "1"
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == []
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    shown = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#verdicts .vline")]
    expected = []
    for policy in ("pytorch", "pytorch:expandable_segments:True"):
        code, text, _ = run_cli(capsys, "run", SNAPSHOTS / OOM_STORY, "--policy", policy, "--capacity", "20GiB",
                                "--fast", "--sites", "0")
        expected.append(text.rstrip("\n").rpartition("\n")[2])
    assert shown == expected and shown[0].startswith("OUT OF MEMORY")
    # Hover the first live block of the map (its position computed by the page itself).
    canvas = browser.find_element(By.ID, "mapcanvas")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
    spot = browser.execute_script(
        "const h = MAP.hit.find(h => D.states[MAP.m.pieces[h[3]][3]] === 'requested' && MAP.m.pieces[h[3]][4] >= 0 "
        "&& D.allocs[MAP.m.pieces[h[3]][4]][5] >= 0); return h ? [h[0] + h[2] / 2, h[1] + 5] : null;")
    assert spot is not None
    w, h = canvas.size["width"], canvas.size["height"]
    ActionChains(browser).move_to_element_with_offset(canvas, int(spot[0] - w / 2), int(spot[1] - h / 2)).perform()
    tip = browser.find_element(By.ID, "tip")
    assert tip.is_displayed()
    assert "category:" in tip.text and "stack (program frames first" in tip.text and "* " in tip.text
    assert browser.get_log("browser") == []
    browser.execute_script("window.scrollTo(0, 0); document.getElementById('tip').style.display = 'none'")
    shot = Path(os.environ.get("ALLOCSIM_SCREENSHOT", str(oom_report.with_suffix(".png"))))
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
