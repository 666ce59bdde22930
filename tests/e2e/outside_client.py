"""A client outside the cluster, for the front door's end-to-end tests (issue 37).

Run inside the dev cluster's outside network namespace (`ClusterNetwork.add_outside`: the nodes' and the
API server's addresses, no route to a Pod or a Service), as a laptop would be: it reaches sessions only
through the front door's NodePort. Each command prints one JSON line for the test to read:

    tick NAMESPACE SESSION CHUNKS        KubeSessions.connect, CHUNKS ticks: the base URL used, frame digests
    request METHOD URL [--token T]       one HTTP request: status, headers, body
    stream URL CHUNKS --token T          our stream through the front door (token in-band), reconnecting on
           [--pause S]                   the close codes of a moved or resuming session, until CHUNKS chunks
    openpi URL STEPS --token T           the real openpi-client (a venv that has it) drives a robot session

(Tokens are options: a URL-safe token may begin with `-`.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import sys
import time
from typing import Any

import httpx

RECONNECT_CODES = (4421, 4503)  # a moved session (misdirected), a resuming one
CAMERA = {
    "track": "camera",
    "schema": "lingbot.camera_actions.v1",
    "data": {"mode": "frames", "frames": [["w"]] * 3},
}


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def tick(namespace: str, session: str, chunks: int) -> dict[str, Any]:
    from ardiff.client import KubeSessions, hold

    sessions = KubeSessions(namespace, kubeconfig=os.environ["KUBECONFIG"])
    with sessions.connect(session, timeout=120) as client:
        digests = [digest(client.tick([hold("w")]).frames.tobytes()) for _ in range(chunks)]
        return {"base": client.endpoint, "digests": digests, "next": client.next_chunk_index}


def request(method: str, url: str, token: str | None) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    body = {"request_id": "outside-0", "chunk_index": 0, "controls": [CAMERA]} if method == "POST" else None
    answer = httpx.request(method, url, headers=headers, json=body, timeout=30)
    text = answer.text if answer.headers.get("content-type", "").startswith("application/json") else ""
    return {"status": answer.status_code, "headers": dict(answer.headers), "body": text}


async def stream(url: str, token: str, chunks: int, pause: float) -> dict[str, Any]:
    """Tick `chunks` chunks over the stream, each one's frames digested; reconnect (at the same front door
    URL) when the worker closes with a code that asks for it, continuing at the next chunk."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    digests: list[str] = []
    closes: list[int] = []
    deadline = time.monotonic() + 120
    while len(digests) < chunks:
        if time.monotonic() > deadline:
            raise TimeoutError(f"stream got {len(digests)} of {chunks} chunks, closes {closes}")
        try:
            async with connect(url, max_size=None) as ws:
                await ws.send(json.dumps({"type": "auth", "token": token}))
                ready = json.loads(await asyncio.wait_for(ws.recv(), 60))
                if ready.get("type") != "ready" or ready["next_chunk_index"] != len(digests):
                    raise RuntimeError(
                        f"not ready at chunk {len(digests)}: {ready}"
                    )  # continues where it was
                while len(digests) < chunks:
                    index = len(digests)
                    tick_body = {"request_id": f"r{index}", "chunk_index": index, "controls": [CAMERA]}
                    await ws.send(json.dumps({"type": "tick", **tick_body}))
                    message = json.loads(await asyncio.wait_for(ws.recv(), 60))
                    if message["type"] == "error":
                        if message["error"].get("retry_after") is not None:
                            await asyncio.sleep(float(message["error"]["retry_after"]))
                            continue
                        # An error that ends the connection is followed by its close (ConnectionClosed,
                        # below); any other is final for this client.
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(ws.recv(), 5)
                        raise RuntimeError(f"stream error: {message}")
                    frames = [await asyncio.wait_for(ws.recv(), 60) for _ in range(message["frames"])]
                    digests.append(digest(b"".join(frames)))
                    await asyncio.sleep(pause)
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd is not None else 1006
            closes.append(code)
            if code not in RECONNECT_CODES:
                raise
            await asyncio.sleep(0.2)
    return {"digests": digests, "closes": closes}


def openpi(url: str, token: str, steps: int) -> dict[str, Any]:
    import numpy as np
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    policy = WebsocketClientPolicy(url, api_key=token)  # openpi's own client: `Api-Key` auth
    metadata = policy.get_server_metadata()
    shapes = []
    for step in range(steps):
        rng = np.random.default_rng(step)
        image = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)
        observation = {
            "observation/exterior_image_0_left": image,
            "observation/exterior_image_1_left": image,
            "observation/wrist_image_left": image,
            "observation/joint_position": rng.random(7),
            "observation/cartesian_position": rng.random(6),
            "observation/gripper_position": rng.random(1),
            "prompt": "pick up the cup",
        }
        shapes.append(list(np.asarray(policy.infer(observation)).shape))
    return {"metadata": sorted(metadata), "shapes": shapes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ticking = commands.add_parser("tick")
    ticking.add_argument("namespace")
    ticking.add_argument("session")
    ticking.add_argument("chunks", type=int)
    asking = commands.add_parser("request")
    asking.add_argument("method")
    asking.add_argument("url")
    asking.add_argument("--token")
    streaming = commands.add_parser("stream")
    streaming.add_argument("url")
    streaming.add_argument("chunks", type=int)
    streaming.add_argument("--token", required=True)
    streaming.add_argument("--pause", type=float, default=0.0)
    robot = commands.add_parser("openpi")
    robot.add_argument("url")
    robot.add_argument("steps", type=int)
    robot.add_argument("--token", required=True)
    args = parser.parse_args()
    if args.command == "tick":
        result = tick(args.namespace, args.session, args.chunks)
    elif args.command == "request":
        result = request(args.method, args.url, args.token)
    elif args.command == "stream":
        result = asyncio.run(stream(args.url, args.token, args.chunks, args.pause))
    else:
        result = openpi(args.url, args.token, args.steps)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
