"""A client of vllm-omni's realtime video protocol (`WS /v1/realtime/video`), written from the protocol's own
description (vllm-omni 0.30.0 `serving_video_output_stream.py`, its docstring) and nothing of ardiff: the
tests drive vllm-omni's handler and an ardiff worker with it alike.

    async with RealtimeClient.connect(url) as client:
        start = await client.start(prompt="...", session_token=token)
        metadata, segment = await client.chunk()
        ...
        done = await client.stop()

Every message received is kept in order in `log` (JSON messages as they came, a binary one as
`{"binary": <bytes>}`); `segments` holds the fragmented-MP4 bytes in order, which `decode` turns into frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import av
import numpy as np
from websockets.asyncio.client import ClientConnection, connect

RECEIVE_SECONDS = 60.0


class RealtimeClient:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.log: list[dict[str, Any]] = []
        self.segments: list[bytes] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls, url: str, *, headers: dict[str, str] | None = None
    ) -> AsyncIterator[RealtimeClient]:
        async with connect(url, additional_headers=headers or {}, max_size=None) as ws:
            yield cls(ws)

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(message))

    async def receive(self) -> dict[str, Any]:
        """The next message: a JSON one, or `{"binary": bytes}`."""
        raw = await asyncio.wait_for(self.ws.recv(), RECEIVE_SECONDS)
        message = {"binary": raw} if isinstance(raw, bytes) else json.loads(raw)
        self.log.append(message)
        if isinstance(raw, bytes):
            self.segments.append(raw)
        return message

    async def until(self, kind: str) -> dict[str, Any]:
        """Messages until one of type `kind` (or an `error`, which is returned instead), within
        `RECEIVE_SECONDS`."""
        async with asyncio.timeout(RECEIVE_SECONDS):
            while True:
                message = await self.receive()
                if message.get("type") in (kind, "error"):
                    return message

    async def start(self, **fields: Any) -> dict[str, Any]:
        await self.send({"type": "session.start", "format": "m4s", **fields})
        return await self.until("video.start")

    async def chunk(self) -> tuple[dict[str, Any], bytes]:
        """The next chunk: its `video.chunk_metadata` and the binary segment right after it."""
        metadata = await self.until("video.chunk_metadata")
        assert metadata["type"] == "video.chunk_metadata", metadata
        segment = await self.receive()
        assert "binary" in segment, f"a binary segment must follow the chunk's metadata, got {segment}"
        assert len(segment["binary"]) == metadata["byte_length"]
        return metadata, segment["binary"]

    async def interact(self, event_id: str, **event: Any) -> dict[str, Any]:
        """A `session.interaction`; its `session.interaction.queued` (or the `error`)."""
        await self.send(
            {"type": "session.interaction", "interaction": {"event_id": event_id, "event": event}}
        )
        return await self.until("session.interaction.queued")

    async def ping(self) -> dict[str, Any]:
        await self.send({"type": "session.ping"})
        return await self.until("session.pong")

    async def stop(self) -> dict[str, Any]:
        await self.send({"type": "session.stop"})
        return await self.until("session.done")

    def chunks(self) -> list[dict[str, Any]]:
        return [m for m in self.log if m.get("type") == "video.chunk_metadata"]


def decode(segments: list[bytes]) -> np.ndarray:
    """The frames of one stream's fragmented MP4 (its segments in order), `N x H x W x 3` uint8."""
    with av.open(io.BytesIO(b"".join(segments)), format="mp4") as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])
