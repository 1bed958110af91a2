"""Size and speed of ``allocsim report``: the page's bytes, the time to write it, and to open it in Chromium.

    python benchmarks/make_big_snapshot.py -o /tmp/big.pickle       # once: the 342 MB snapshot
    python benchmarks/bench_report.py /tmp/big.pickle [--opens 3]

Opening needs selenium and Debian's chromium + chromium-driver (as the browser tests do); without
them only the build is measured. "open" is from ``get()`` until the page's script has drawn
everything (the load event), the file read from disk with the network blocked.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def open_times(page: Path, opens: int) -> list[float] | str:
    """Seconds per open in headless Chromium, or why it could not be measured."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return "selenium is not installed"
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not binary or not driver:
        return "no chromium / chromedriver"
    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
                "--disable-component-update", "--disable-sync", "--window-size=1400,1000"):
        opts.add_argument(arg)
    opts.binary_location = binary
    browser = webdriver.Chrome(service=Service(driver), options=opts)
    try:
        browser.execute_cdp_cmd("Network.enable", {})
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["http://*", "https://*"]})
        out = []
        for _ in range(opens):
            started = time.perf_counter()
            browser.get(page.as_uri())
            if browser.execute_script("return document.body.dataset.ready") != "1":
                return "the page did not finish drawing"
            out.append(time.perf_counter() - started)
        return out
    finally:
        browser.quit()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--opens", type=int, default=3)
    parser.add_argument("--keep", metavar="PAGE.html", help="write the page here (default: a temporary file)")
    args = parser.parse_args()
    page = Path(args.keep) if args.keep else Path(tempfile.mkdtemp()) / "report.html"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "allocsim", "report", args.trace, "-o", str(page)], env=env,
                          capture_output=True, text=True)
    built = time.perf_counter() - started
    if proc.returncode != 0:
        print(proc.stderr.strip(), file=sys.stderr)
        return proc.returncode
    print(f"page: {page.stat().st_size:,} bytes ({page.stat().st_size / 2**20:.2f} MiB), written in {built:.1f} s "
          f"(the whole `allocsim report` command, reading the trace included)")
    opened = open_times(page, args.opens)
    if isinstance(opened, str):
        print(f"open: not measured: {opened}")
    else:
        print("open in headless Chromium: " + ", ".join(f"{t:.2f} s" for t in opened))
    try:
        print(f"load average: {os.getloadavg()[0]:.1f} (1 min)")
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
