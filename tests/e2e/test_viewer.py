"""`ardiff view` in a real headless Chromium (Debian's chromium + chromium-driver, driven by Selenium):
keys pressed on the page become ticks with those controls, frames arrive and change on the canvas, the page
shows the session's phase, the token never reaches the page, the page plays at the session's rate from its
buffer (reporting it with each tick) however fast ticks come, and the viewer follows the session when its
worker dies.

The dev cluster runs worker Pods on the fake runtime (the worker app, its stream and the control plane are
real; frames are a deterministic function of the controls, so different keys give different pictures).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from ardiff.devcluster.cluster import DevCluster
from ardiff.devcluster.pools import build_pool
from ardiff.devcluster.waiting import wait_until
from tests.e2e.conftest import REPO, Stack, restore_default_sigint, running_stack

pytestmark = pytest.mark.slow

POOL = build_pool("view", capacity=1, min_replicas=1, max_replicas=2, fake=True)
POOL["spec"]["env"].append({"name": "ARDIFF_FAKE_TICK_SECONDS", "value": "0.1"})  # a steady tick rate
PLAYOUT = {"fps": 8, "bufferChunks": 3}  # the pool's sessions' target (not the defaults: 16 fps, 2 chunks)
POOL["spec"]["playout"] = PLAYOUT
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SCREENSHOT = REPO / "demo-out" / "viewer.png"


@pytest.fixture(scope="module")
def stack(dev_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(dev_cluster, "e2e-viewer", tmp_path_factory.mktemp("e2e-viewer"), POOL) as running:
        wait_until(lambda: running.ready_pods(), timeout=60, what="a ready fake worker pod")
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=800,800")
    # The Debian driver, never a download (Selenium Manager is not asked when a path is given).
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    yield driver
    driver.quit()


class Viewer:
    """`ardiff view NAME` as a user runs it: a process that prints the page's URL."""

    def __init__(self, stack: Stack, name: str) -> None:
        command = [sys.executable, "-m", "ardiff.cli", "view", name, "-n", stack.namespace, "--port", "0"]
        command += ["--kubeconfig", str(stack.kube.kubeconfig)]
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ},
            preexec_fn=restore_default_sigint,  # Ctrl-C reaches it even when this run ignores SIGINT
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert "viewer of session" in line, line + self.process.stdout.read()
        self.url = line.split(" at ")[1].split()[0]

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=20)


def page_log(driver: webdriver.Chrome) -> dict[str, Any]:
    return driver.execute_script("return window.ardiffViewer")


def canvas(driver: webdriver.Chrome) -> str:
    return driver.execute_script("return document.getElementById('screen').toDataURL()")


def hold_key(driver: webdriver.Chrome, key: str, seconds: float = 0.4) -> None:
    ActionChains(driver).key_down(key).pause(seconds).key_up(key).perform()


def sent_with(driver: webdriver.Chrome, key: str) -> int | None:
    """The chunk index of the first tick the page sent holding `key`."""
    return next((t["chunk_index"] for t in page_log(driver)["sent"] if key in t["keys"]), None)


def received(driver: webdriver.Chrome, chunk_index: int) -> bool:
    return any(c["chunk_index"] >= chunk_index for c in page_log(driver)["chunks"])


def test_keys_steer_the_session_and_frames_change_in_chromium(
    stack: Stack, browser: webdriver.Chrome
) -> None:
    name = stack.session("viewed", seed=11)
    status = stack.sessions.wait_ready(name, timeout=60)
    viewer = Viewer(stack, name)
    try:
        browser.get(viewer.url)
        wait_until(lambda: len(page_log(browser)["chunks"]) >= 2, timeout=30, what="the first chunks")
        before = canvas(browser)
        assert all(not tick["keys"] for tick in page_log(browser)["sent"][:2])  # nothing pressed yet

        hold_key(browser, "w")
        walked = wait_until(lambda: sent_with(browser, "w"), timeout=10, what="a tick holding W")
        hold_key(browser, Keys.ARROW_LEFT)  # the arrows look around: left is J
        turned = wait_until(lambda: sent_with(browser, "j"), timeout=10, what="a tick holding J")
        wait_until(lambda: received(browser, max(walked, turned)), timeout=30, what="their chunks")
        assert canvas(browser) != before

        chunks = page_log(browser)["chunks"]
        assert [c["chunk_index"] for c in chunks] == list(range(len(chunks)))  # in order, none lost
        assert chunks[0]["frames"] == 9
        assert all(c["frames"] == 12 for c in chunks[1:])
        assert browser.find_element(By.ID, "phase").text.startswith("Ready")
        assert int(browser.find_element(By.ID, "chunk").text) >= max(walked, turned)
        assert int(browser.find_element(By.ID, "latency").text) >= 0
        # The worker served these ticks (its own count), and the token never reached the page.
        served = next(s for s in stack.worker(status["pod"])["sessions"] if s["session_id"] == name)
        assert served["ticks"] >= len(chunks)
        token = stack.sessions.token(name, status)
        assert token not in browser.page_source
        SCREENSHOT.parent.mkdir(exist_ok=True)
        assert browser.save_screenshot(str(SCREENSHOT))
        assert SCREENSHOT.stat().st_size > 1000
    finally:
        viewer.stop()


def test_the_page_plays_at_the_sessions_rate_not_as_fast_as_ticks_come(
    stack: Stack, browser: webdriver.Chrome
) -> None:
    name = stack.session("paced", seed=13)
    status = stack.sessions.wait_ready(name, timeout=60)
    assert status["playout"] == PLAYOUT
    viewer = Viewer(stack, name)
    try:
        browser.get(viewer.url)
        wait_until(lambda: len(page_log(browser)["chunks"]) >= 3, timeout=30, what="the first chunks")
        before, started = page_log(browser), time.monotonic()
        time.sleep(6)
        after, seconds = page_log(browser), time.monotonic() - started
        fps, buffer_chunks = after["playout"]["fps"], after["playout"]["bufferChunks"]
        assert (fps, buffer_chunks) == (PLAYOUT["fps"], PLAYOUT["bufferChunks"])  # the session's target
        # Frames are drawn at the session's rate; ticks (0.1 s each: 120 frames/s possible) only keep the
        # buffer at its target, about fps / 12 chunks a second.
        shown = (after["shown"] - before["shown"]) / seconds
        assert fps * 0.85 <= shown <= fps * 1.1, shown
        chunks = (len(after["chunks"]) - len(before["chunks"])) / seconds
        assert chunks <= 1.5 * fps / 12, chunks
        # Every tick says what the page held unshown: nothing at first, then up to its target.
        buffers = [tick["buffer_ms"] for tick in after["sent"]]
        assert buffers[0] == 0
        assert all(0 < ms <= buffer_chunks * 12 * 1000 / fps for ms in buffers[3:]), buffers
    finally:
        viewer.stop()


def test_the_viewer_follows_the_session_when_its_worker_dies(stack: Stack, browser: webdriver.Chrome) -> None:
    name = stack.session("followed", seed=12)
    before = stack.sessions.wait_ready(name, timeout=60)
    viewer = Viewer(stack, name)
    try:
        browser.get(viewer.url)
        wait_until(lambda: len(page_log(browser)["chunks"]) >= 2, timeout=30, what="the first chunks")
        stack.kill(before["pod"], signal.SIGKILL)
        # The session is placed again (its KV is gone); the viewer reconnects and the page is told to reset.
        wait_until(lambda: page_log(browser)["readies"] >= 2, timeout=60, what="a second ready")
        wait_until(
            lambda: "press R" in browser.find_element(By.ID, "notice").text,
            timeout=10,
            what="the reset notice",
        )
        started = time.monotonic()
        ActionChains(browser).send_keys("r").perform()
        wait_until(
            lambda: any(t["reset"] for t in page_log(browser)["sent"]), timeout=10, what="a reset tick"
        )
        count = len(page_log(browser)["chunks"])
        wait_until(
            lambda: len(page_log(browser)["chunks"]) > count + 1, timeout=30, what="chunks after reset"
        )
        after = page_log(browser)["chunks"][count:]
        assert after[0]["chunk_index"] == 0
        assert after[0]["frames"] == 9
        assert time.monotonic() - started < 30
        phase = browser.find_element(By.ID, "phase")
        assert "Lost" in page_log(browser)["phases"]  # the page showed what happened
        wait_until(lambda: phase.text.startswith("Ready"), timeout=10, what="the phase Ready again")
    finally:
        viewer.stop()


def test_an_unknown_session_is_a_clear_cli_error(stack: Stack) -> None:
    command = [sys.executable, "-m", "ardiff.cli", "view", "nobody", "-n", stack.namespace, "--port", "0"]
    command += ["--kubeconfig", str(stack.kube.kubeconfig)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert "error: session_not_found" in result.stderr
    assert "Traceback" not in result.stderr


def test_z_steps_back_a_kept_chunk_and_b_opens_a_fork_in_a_new_tab(
    stack: Stack, browser: webdriver.Chrome
) -> None:
    """Issue 26: Z rewinds the session to the kept chunk before the one on screen (the page then plays on
    from there), Backspace too, and B forks it at the end of the chunk on screen, opening the child's page
    in a new tab that plays the child from that chunk."""
    # Kept as long as a pod start for the child takes: the parent ticks on meanwhile.
    name = stack.session("branched", seed=14, keep_chunks=64)
    stack.sessions.wait_ready(name, timeout=60)
    viewer = Viewer(stack, name)
    tabs = set(browser.window_handles)
    try:
        browser.get(viewer.url)
        wait_until(lambda: page_log(browser)["shown"] >= 4 * 12, timeout=60, what="four chunks shown")
        ActionChains(browser).send_keys("z").perform()
        rewind = wait_until(lambda: page_log(browser)["rewinds"][:1], timeout=20, what="a rewind")[0]
        target = rewind["chunk_index"]
        assert target >= 2
        assert target in rewind["kept_chunks"]
        assert max(rewind["kept_chunks"]) == target  # the later ones dropped
        count = len(page_log(browser)["chunks"])
        wait_until(lambda: len(page_log(browser)["chunks"]) > count + 1, timeout=30, what="chunks after it")
        assert [c["chunk_index"] for c in page_log(browser)["chunks"][count:][:2]] == [target, target + 1]
        # Paused, the page draws nothing of the chunk it rewound to: B forks at that kept boundary (it once
        # asked for the chunk after it, which the session no longer keeps, and the child failed).
        ActionChains(browser).send_keys(" ").perform()
        ActionChains(browser).send_keys(Keys.BACKSPACE).perform()
        second = wait_until(lambda: page_log(browser)["rewinds"][1:2], timeout=20, what="a second rewind")[0]
        assert 1 <= second["chunk_index"] <= target + 1
        assert browser.current_url == viewer.url  # Backspace did not navigate away

        ActionChains(browser).send_keys("b").perform()
        fork = wait_until(lambda: page_log(browser)["forks"][:1], timeout=20, what="a fork")[0]
        ActionChains(browser).send_keys(" ").perform()
        child, at = fork["session"], fork["chunk"]
        assert at == second["chunk_index"]
        stack.created.append(child)
        assert child.startswith(f"{name}-b{at}-")
        assert stack.sessions.get(child)["spec"]["forkFrom"] == {"session": name, "chunk": at}
        new_tabs = wait_until(
            lambda: set(browser.window_handles) - tabs - {browser.current_window_handle},
            timeout=10,
            what="the child's tab",
        )
        parent_tab = browser.current_window_handle
        browser.switch_to.window(new_tabs.pop())
        try:
            wait_until(lambda: browser.current_url == fork["url"], timeout=10, what="the child's page")
            assert f"session {child}" in browser.find_element(By.TAG_NAME, "h1").text
            wait_until(lambda: page_log(browser)["chunks"][:1], timeout=90, what="the child's first chunk")
            assert page_log(browser)["chunks"][0]["chunk_index"] == at  # it starts at the fork's chunk
            assert page_log(browser)["chunks"][0]["frames"] == 12
        finally:
            browser.close()
            browser.switch_to.window(parent_tab)
    finally:
        viewer.stop()
