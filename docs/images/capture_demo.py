"""Take the docs' dashboard screenshots from `hami demo --keep` with headless Chromium (Debian's `chromium` and
`chromium-driver`, as the browser tests use):

    .venv/bin/python docs/images/capture_demo.py [OUTPUT_DIR]     # default: docs/images

Starts the demo as its own process, waits until the dashboard shows what the node daemons measure, saves the
cluster, workloads, node and device pages as PNG (the whole page, up to 2,400 px high), and stops the demo it
started with SIGINT, as Ctrl-C does.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

ROOT = Path(__file__).resolve().parents[2]
PAGES = {
    "dashboard-demo-cluster": "",
    "dashboard-demo-workloads": "workloads",
    "dashboard-demo-node": "nodes/gpu-node",
    "dashboard-demo-device": "devices/GPU-a100-0",
}


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "images"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        print("needs chromium and chromedriver (apt-get install -y chromium chromium-driver)", file=sys.stderr)
        return 2
    workdir = tempfile.mkdtemp(prefix="hami-demo-shots-")
    demo = subprocess.Popen(
        [sys.executable, "-m", "hami.cli", "demo", "--json", "--keep", "--workdir", workdir],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert demo.stdout is not None
        url = json.loads(demo.stdout.readline())["dashboard"]
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1440,900"):
            options.add_argument(flag)
        browser = webdriver.Chrome(options=options, service=Service(executable_path=driver))
        try:
            time.sleep(8)  # a few usage rounds, so the trends have points
            for name, path in PAGES.items():
                browser.get(url + path)
                time.sleep(1)
                size = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
                clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 2400), "scale": 1}
                shot = browser.execute_cdp_cmd(
                    "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
                )
                (out / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))
                print(out / f"{name}.png")
        finally:
            browser.quit()
    finally:
        os.kill(demo.pid, signal.SIGINT)
        demo.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
