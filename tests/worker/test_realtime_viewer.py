"""`ardiff view`'s video page (issue 38 item 4) in a real headless Chromium: the page plays the session's
realtime video stream in a `<video>` element through Media Source Extensions, frames advance at the session's
playout rate, a held key turns the session's camera and so the picture, and the page's counters show the
chunks received and the stalls; Space stops the stream (the picture runs dry: a stall) and starts a new one,
which continues the session.

The viewer (the real aiohttp app, on this test's loop) proxies to `realtime_worker` (a real worker process on
the fake runtime, in this directory to share it: its sessions play at 48 fps); a stand-in for the cluster
says the session is Ready there. The fake runtime tints each frame by a colour drawn from its prompt, chunk
and camera, so the mean colour of each frame Chromium shows says which camera made it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from selenium import webdriver
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

from ardiff.viewer import SessionViewer, ViewerSettings, origin_of
from ardiff.worker.conditioning import Conditioning, seed_image
from ardiff.worker.fake_runtime import fake_frames
from ardiff.worker.realtime_messages import IDLE_CAMERA, upstream
from ardiff.worker.tick_rules import parse_tick
from tests.chromium import headless_chromium
from tests.worker.conftest import REALTIME_POD, REALTIME_POOL, REALTIME_TOKEN

FPS = (
    24.0  # this session's playout rate: half the other realtime tests', a browser on a busy machine keeps up
)
PROMPT = "a walk in the forest"
STILL = [{**IDLE_CAMERA, "data": {"mode": "frames", "frames": [[]] * 3}}]  # a chunk's camera, no key held


class ReadySessions:
    """The session's status as `KubeSessions` reports it: Ready on the realtime worker."""

    def __init__(self, url: str) -> None:
        self.url = url

    def status(self, name: str) -> dict[str, Any]:
        return {"phase": "Ready", "endpoint": self.url, "pod": REALTIME_POD}

    def token(self, name: str, status: dict[str, Any]) -> str:
        return REALTIME_TOKEN


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    with headless_chromium("--autoplay-policy=no-user-gesture-required") as driver:
        yield driver


@pytest.fixture
async def viewer(realtime_worker, placer) -> AsyncIterator[SessionViewer]:
    session = await placer(REALTIME_POOL, REALTIME_POD, REALTIME_TOKEN, close_on=realtime_worker)(
        prompt=PROMPT, playout_fps=FPS, playout_buffer_chunks=2
    )
    served = SessionViewer(ViewerSettings(session=session), ReadySessions(realtime_worker.url))  # type: ignore[arg-type]
    runner = web.AppRunner(served.app(), shutdown_timeout=1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    served.origin = origin_of("127.0.0.1", runner.addresses[0][1])
    try:
        yield served
    finally:
        await runner.cleanup()


async def page_log(driver: webdriver.Chrome, *, colours: bool = False) -> dict[str, Any]:
    """The page's log; without `colours` (thousands of frames) but the media time of the latest frame."""
    script = (
        "const {colours, ...log} = window.ardiffViewer;"
        "return {...log, media_time: colours.length ? colours[colours.length - 1][0] : 0,"
        f" colours: {'colours' if colours else '[]'}}}"
    )
    return await asyncio.to_thread(driver.execute_script, script)


async def until(
    driver: webdriver.Chrome, check: Callable[[dict[str, Any]], Any], what: str, within: float = 30
):
    """The page's log once `check` holds for it (polled; the viewer serves on this loop meanwhile)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        log = await page_log(driver)
        if check(log):
            return log
        await asyncio.sleep(0.2)
    raise AssertionError(f"not within {within} s: {what}; the page's log: {log}")


async def hud(driver: webdriver.Chrome, name: str) -> str:
    return await asyncio.to_thread(lambda: driver.find_element(By.ID, name).text)


def cameras(chunks: list[dict[str, Any]], sent: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The camera each chunk was ticked with: the page's key events of each chunk (its `started_event_ids`)
    through vllm-omni's own reducer, as the worker sampled them."""
    protocol = upstream()
    keys = {event["event_id"]: event["keys"] for event in sent}
    reducer = protocol.control_reducer()

    def event(number: int, actions: list[str]) -> Any:
        control = {**IDLE_CAMERA, "data": {"mode": "state", "transitions": [{"actions": actions}]}}
        return protocol.session_event(event_id=number, controls=(protocol.control_input.from_dict(control),))

    prepared = reducer.prepare(current_controls={}, events=[event(0, [])], chunk_index=0)
    reducer.commit(prepared)
    made = []
    for chunk in chunks:
        events = [event(n, keys[e]) for n, e in enumerate(chunk["started"], start=1)]
        current = {control.track: control for control in prepared.controls}
        prepared = reducer.prepare(current_controls=current, events=events, chunk_index=chunk["chunk_index"])
        reducer.commit(prepared)
        made.append([control.to_dict() for control in prepared.controls])
    return made


def released_and_shown(log: dict[str, Any]) -> bool:
    """Whether the page shows the chunk its second key event (the release) started on."""
    if len(log["sent"]) < 2:
        return False
    released, first = log["sent"][1]["event_id"], 0
    for chunk in log["chunks"]:
        if released in chunk["started"]:
            return log["media_time"] * FPS >= first
        first += chunk["frames"]
    return False


def colour_error(shown: np.ndarray, expected: np.ndarray) -> float:
    """The median over frames of the largest channel difference of their mean colours (Chromium's decoder and
    colour conversion keep the right frames within 2 to 6 levels; the same chunk held still was 45 away)."""
    return float(np.median(np.abs(shown - expected).max(axis=1)))


def mean_colours(session: str, chunk_index: int, controls: list[dict[str, Any]]) -> np.ndarray:
    """The fake runtime's frames of that chunk, each frame's mean colour."""
    tick = parse_tick(session, {"request_id": "x", "chunk_index": chunk_index, "controls": controls})
    frames = fake_frames(Conditioning(seed=0, prompt=PROMPT), seed_image(0, 64, 64), tick)
    return frames.reshape(len(frames), -1, 3).mean(axis=1)


async def test_the_video_page_plays_the_stream_and_keys_turn_the_picture(browser, viewer) -> None:
    session = viewer.settings.session
    await asyncio.to_thread(browser.get, f"{viewer.url()}video")
    log = await until(browser, lambda log: log["presented"] >= 2 * 12, "the first chunks shown")
    assert log["starts"][0] == {"id": session, "chunk_index": 0, "fps": FPS, "buffer_chunks": 2}
    assert (log["phases"][0], log["playout"]) == ("Ready", {"fps": FPS, "bufferChunks": 2})

    # Frames advance at the session's playout rate (the frame on screen, by its media time) and the chunks
    # come paced to it. A window in which the page stalled (the browser starved of CPU on a busy machine) is
    # measured again, up to three.
    for _ in range(3):
        before, started = await page_log(browser), time.monotonic()
        await asyncio.sleep(3)
        after = await page_log(browser)
        if after["stalls"] == before["stalls"]:
            break
    assert after["stalls"] == before["stalls"], f"a stall in every window: {after['stalls']}"
    seconds = time.monotonic() - started
    advanced = (after["media_time"] - before["media_time"]) * FPS / seconds
    assert 0.85 * FPS <= advanced <= 1.1 * FPS, advanced
    received = (len(after["chunks"]) - len(before["chunks"])) / seconds
    assert 0.7 * FPS / 12 <= received <= 1.2 * FPS / 12, received
    assert int(await hud(browser, "chunks")) >= len(after["chunks"]) > len(before["chunks"])

    # A held key turns the camera: the chunks made while L was held show other colours than the same chunks
    # held still would, and exactly the ones the worker's camera gives.
    await asyncio.to_thread(ActionChains(browser).key_down("l").pause(1.2).key_up("l").perform)
    await until(browser, released_and_shown, "the chunk the key's release started on, shown")
    log = await page_log(browser, colours=True)
    assert [event["keys"] for event in log["sent"]] == [["l"], []]
    chunks, colours = log["chunks"], np.asarray(log["colours"])
    starts = np.cumsum([0] + [chunk["frames"] for chunk in chunks])
    turned = 0
    for chunk, camera, first in zip(chunks, cameras(chunks, log["sent"]), starts, strict=False):
        frame = np.round(colours[:, 0] * FPS).astype(int) - first  # each shown frame's index in this chunk
        here = (frame >= 0) & (frame < chunk["frames"])
        if not here.any():
            continue
        expected = colour_error(
            colours[here, 1:], mean_colours(session, chunk["chunk_index"], camera)[frame[here]]
        )
        assert expected < 10, (chunk, expected)
        if camera != STILL:  # L held in this chunk: the same chunk held still is another picture
            still = colour_error(
                colours[here, 1:], mean_colours(session, chunk["chunk_index"], STILL)[frame[here]]
            )
            assert still > 20, (chunk, still)
            turned += 1
    assert turned >= 2

    # Space stops the stream: the picture runs dry (a stall on the counter); Space again starts a new stream,
    # which continues the session at its next chunk.
    stalls = (await page_log(browser))["stalls"]
    await asyncio.to_thread(ActionChains(browser).send_keys(" ").perform)
    log = await until(browser, lambda log: log["dones"] and log["stalls"] > stalls, "the stop, then a stall")
    assert await hud(browser, "stalls") == str(log["stalls"])
    assert "stopped" in await hud(browser, "notice")
    done = log["dones"][0]
    assert (done["stopped"], done["chunks"]) == (True, len(log["chunks"]))  # every chunk sent was received
    await asyncio.to_thread(ActionChains(browser).send_keys(" ").perform)
    log = await until(
        browser,
        lambda log: len(log["starts"]) == 2 and len(log["chunks"]) > done["chunks"] + 1,
        "a new stream",
    )
    assert log["starts"][1]["chunk_index"] == done["chunks"]
    assert [chunk["chunk_index"] for chunk in log["chunks"]] == list(range(len(log["chunks"])))
    shown = log["presented"]
    await until(browser, lambda log: log["presented"] > shown + FPS, "frames shown again")
    await asyncio.to_thread(browser.get, "about:blank")  # the page's socket closes before the viewer stops
