"""The dashboard in a real browser: headless Chromium driven by Selenium against a known cluster served by the
in-memory API server and read by `hami dashboard`'s path (a kubeconfig, the real client). Each page shows the
right figures, a pod placed after a page was opened appears on it without a reload, the API server going away
is said on the open page, the pages work from the keyboard, and what gpu-node's daemon measures (its metrics served
beside) shows next to the grants; a screenshot of each page is written to
$HAMI_ARTIFACTS/dashboard (default build/artifacts/dashboard).

Needs Debian's `chromium` and `chromium-driver` (`apt-get install -y chromium chromium-driver`): skipped when
they are absent, unless HAMI_BROWSER_REQUIRED=1 (CI), where their absence fails.
"""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from dashboard_world import FlakyApiServer, NodeMetricsServer, build, place_new_pod

from hami.cluster import MemoryCluster
from hami.dashboard.cli import start_dashboard
from hami.plugins import VendorPlugins
from hami.status import connect_cluster

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = os.environ.get("HAMI_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = os.environ.get("HAMI_CHROMEDRIVER") or shutil.which("chromedriver")
ARTIFACTS = Path(os.environ.get("HAMI_ARTIFACTS") or Path(__file__).parents[2] / "build" / "artifacts") / "dashboard"

if not (CHROMIUM and DRIVER):
    if os.environ.get("HAMI_BROWSER_REQUIRED") == "1":
        raise RuntimeError("HAMI_BROWSER_REQUIRED=1 but chromium or chromedriver is not installed")
    pytest.skip("no chromium and chromedriver here (apt-get install chromium chromium-driver)", allow_module_level=True)


class Dashboard:
    def __init__(self, url: str, api: FlakyApiServer, cluster: MemoryCluster, browser: WebDriver) -> None:
        self.url, self.api, self.cluster, self.browser = url, api, cluster, browser

    def open(self, path: str) -> None:
        self.browser.get(self.url + path)
        WebDriverWait(self.browser, 10).until(lambda b: b.find_element(By.ID, "content"))

    def text(self, css: str) -> str:
        return " ".join(str(self.browser.find_element(By.CSS_SELECTOR, css).text).split())

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        size = self.browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 2400), "scale": 1}
        shot = self.browser.execute_cdp_cmd(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
        )
        path.write_bytes(base64.b64decode(shot["data"]))  # the whole page, not only what the window shows
        return path


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    cluster = build()
    metrics = NodeMetricsServer()  # gpu-node's daemon answers; t4-node's does not
    with FlakyApiServer(cluster) as api:
        kubeconfig = api.write_kubeconfig(tmp_path_factory.mktemp("dashboard") / "kubeconfig")
        server, source = start_dashboard(
            connect_cluster(str(kubeconfig), None, component="hami-dashboard"), VendorPlugins.load(), ("127.0.0.1", 0),
            history_interval=0.5, title="demo", node_metrics=metrics.template,
        )  # fmt: skip
        server.app.poll_seconds = 0.5
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1440,900", "--force-device-scale-factor=1"):  # fmt: skip
            options.add_argument(flag)
        browser = webdriver.Chrome(options=options, service=Service(executable_path=str(DRIVER)))
        try:
            yield Dashboard(f"http://127.0.0.1:{server.port}", api, cluster, browser)
        finally:
            browser.quit()
            server.stop()
            source.stop()
            metrics.stop()


def test_cluster_page_shows_the_known_clusters_figures(dashboard: Dashboard) -> None:
    dashboard.open("/")
    assert dashboard.text("#total-devices") == "6"
    assert dashboard.text("#total-pods") == "4"
    assert dashboard.text("#total-memory") == "59960 / 194560 MiB 30%"
    a100 = dashboard.text('#groups tr[data-model="NVIDIA-A100"]')
    assert a100 == (
        "NVIDIA NVIDIA NVIDIA-A100 4 56960 / 163840 MiB 34% 50 / 400 % 12% 2 / 1 40960 MiB 23% "
        "106880 MiB (100%) for 1 waiting"
    )
    WebDriverWait(dashboard.browser, 10).until(lambda b: "9000" in b.find_element(By.ID, "used-memory").text)
    assert dashboard.text("#used-memory") == "9000 / 40960 MiB 21%"
    assert dashboard.text("#used-busy") == "50%"
    assert dashboard.text("#used-reporting") == "1 of 6 devices, 1 of 2 nodes"
    assert "too-big 0/2 nodes are available" in dashboard.text("#pending")
    WebDriverWait(dashboard.browser, 10).until(lambda b: b.find_elements(By.CSS_SELECTOR, "svg.history"))
    dashboard.shot("cluster")


def test_node_page_shows_each_device_with_its_shares(dashboard: Dashboard) -> None:
    dashboard.open("/nodes/gpu-node")
    first = dashboard.text('li[data-device="GPU-gpu-node-0"]')
    assert "index 0 · NUMA 0 · shared by 3/10 · cores 50/100%" in first
    assert "16000 / 40960 MiB" in first
    assert "train 10000 MiB, 30% cores" in first
    segments = dashboard.browser.find_elements(By.CSS_SELECTOR, 'li[data-device="GPU-gpu-node-0"] .bar .seg')
    widths = [round(s.size["width"] / s.find_element(By.XPATH, "..").size["width"] * 100) for s in segments]
    assert widths == [24, 15]  # train 10000 and infer 6000 of 40960 MiB, drawn to scale
    assert dashboard.text("#lock").startswith("Held by binding for")
    dashboard.shot("node")


def test_device_and_pod_pages(dashboard: Dashboard) -> None:
    dashboard.open("/devices/GPU-gpu-node-0")
    assert dashboard.text("#sharers tbody") == (
        "train 1 10000 MiB 30% 7000 MiB 25% team-a/infer 2 6000 MiB 20% 2000 MiB 0%"  # granted, then measured
    )
    assert dashboard.text("#power") == "251.5 W"
    dashboard.shot("device")
    dashboard.open("/pods/default/too-big")
    assert dashboard.text("#unschedulable") == (
        "Unschedulable. 0/2 nodes are available: 2 no device with 100000 MiB free."
    )
    dashboard.shot("pod")


def test_workloads_page_and_a_pods_containers(dashboard: Dashboard) -> None:
    dashboard.open("/workloads")
    WebDriverWait(dashboard.browser, 10).until(lambda b: "7000 MiB" in b.find_element(By.ID, "workloads").text)
    assert dashboard.text('#workloads tr[data-pod="default/train"]').startswith(
        "train gpu-node GPU-gpu-node-0 10000 MiB 7000 MiB (70%) 30% 25%"
    )
    assert "unknown" in dashboard.text('#workloads tr[data-pod="default/binding"]')  # t4-node's daemon is silent
    dashboard.shot("workloads")
    dashboard.open("/pods/team-a/infer")
    assert dashboard.text("#containers tbody").startswith("c0 GPU-gpu-node-0 4000 MiB 1000 MiB 20% 0%")
    dashboard.open("/devices/GPU-gpu-node-1")
    assert dashboard.text("#in-use") == "unknown"  # its driver read nonsense
    dashboard.shot("device-usage")


def test_unknown_names_get_a_clear_page(dashboard: Dashboard) -> None:
    dashboard.open("/nodes/no-such-node")
    assert dashboard.text("#missing") == "The cluster has no node no-such-node."
    assert dashboard.browser.find_element(By.LINK_TEXT, "gpu-node")
    dashboard.shot("missing")


def test_the_pages_work_from_the_keyboard(dashboard: Dashboard) -> None:
    dashboard.open("/")
    body = dashboard.browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.TAB)
    assert dashboard.browser.switch_to.active_element.text == "Skip to the figures"

    def press(key: str) -> None:  # to whatever has the focus, as a person's keyboard would
        ActionChains(dashboard.browser).send_keys(key).perform()

    for _ in range(400):
        try:
            if dashboard.browser.switch_to.active_element.text == "t4-node":
                break
        except StaleElementReferenceException:  # a live update replaced the element as it was read
            pass
        press(Keys.TAB)
    else:
        pytest.fail("the node link t4-node is not reachable with Tab")
    press(Keys.ENTER)
    WebDriverWait(dashboard.browser, 10).until(lambda b: b.current_url.endswith("/nodes/t4-node"))


def test_a_newly_placed_pod_appears_without_reload_and_a_lost_api_server_is_said(dashboard: Dashboard) -> None:
    dashboard.open("/nodes/t4-node")
    assert "late" not in dashboard.text("#devices")
    dashboard.browser.execute_script("window.hamiNoReload = 42")
    place_new_pod(dashboard.cluster)
    WebDriverWait(dashboard.browser, 10).until(lambda b: "late 5000 MiB" in b.find_element(By.ID, "devices").text)
    assert dashboard.browser.execute_script("return window.hamiNoReload") == 42
    assert "5000 / 15360 MiB" in dashboard.text('li[data-device="GPU-t4-node-1"]')
    dashboard.shot("live")
    dashboard.api.down = True
    try:
        WebDriverWait(dashboard.browser, 30).until(lambda b: b.find_elements(By.ID, "stale"))
        assert dashboard.text("#stale").startswith("Figures may be out of date. the Kubernetes API server did not")
        assert "late 5000 MiB" in dashboard.text("#devices")  # the figures last read stay
        assert dashboard.browser.execute_script("return window.hamiNoReload") == 42
        dashboard.shot("stale")
    finally:
        dashboard.api.down = False
