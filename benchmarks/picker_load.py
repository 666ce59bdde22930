"""Load on the endpoint picker's gRPC service for `benchmarks/gateway.py` (its `picker` part), run by the
gateway image's venv: it holds Envoy's API for Python (`xds-protos`), which the dev venv does not.

`--concurrency` callers share one channel (as one Envoy worker thread does) for `--seconds`, each calling in a
loop, one of:
- `decide`: one ext_proc stream per request, as Envoy opens one per HTTP request: a placed session's tick
  headers out, the picker's answer back (the sessions taken in turn from the JSON list on stdin);
- `refuse`: the same stream for a path under the pool that is no session route (its `/metrics`): the picker
  answers 404 from the headers alone, without reading the store;
- `health`: the gRPC health service's `Check` on the same server, the cheapest call it answers.
Prints one JSON line: the calls answered, the seconds they took, and the answers by kind (`forward`, or an
immediate answer's HTTP status; `SERVING` for a health check).

    <gateway venv>/bin/python benchmarks/picker_load.py --target 127.0.0.1:9002 --mode decide \
        --base /pools/<namespace>/<pool> --token TOKEN < sessions.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import sys
import time

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def request_headers(method: str, path: str, token: str) -> ext_proc.ProcessingRequest:
    """The request headers Envoy sends the picker for `method` `path` with the bearer `token`."""
    pairs = (
        (":method", method),
        (":path", path),
        (":authority", "front-door"),
        ("authorization", f"Bearer {token}"),
        ("content-type", "application/json"),
    )
    headers = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs]
    )
    return ext_proc.ProcessingRequest(
        request_headers=ext_proc.HttpHeaders(headers=headers, end_of_stream=False)
    )


async def decide(stub: ext_proc_grpc.ExternalProcessorStub, request: ext_proc.ProcessingRequest) -> str:
    answer = "none"
    async for response in stub.Process(iter([request])):
        kind = response.WhichOneof("response")
        answer = "forward" if kind == "request_headers" else str(response.immediate_response.status.code)
    return answer


async def check(stub: health_pb2_grpc.HealthStub) -> str:
    response = await stub.Check(health_pb2.HealthCheckRequest(service="readiness"))
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, help="the picker's gRPC address, host:port")
    parser.add_argument("--mode", choices=("decide", "refuse", "health"), required=True)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--base", default="", help="the pool's base path at the front door")
    parser.add_argument("--token", default="", help="the sessions' bearer token")
    args = parser.parse_args()
    sessions = itertools.cycle(json.load(sys.stdin) if args.mode == "decide" else [""])
    answers: collections.Counter[str] = collections.Counter()
    async with grpc.aio.insecure_channel(args.target) as channel:
        picker = ext_proc_grpc.ExternalProcessorStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        await check(health)  # the channel connected before the clock starts
        deadline = time.monotonic() + args.seconds

        async def call() -> str:
            if args.mode == "health":
                return await check(health)
            if args.mode == "refuse":
                return await decide(picker, request_headers("GET", f"{args.base}/metrics", args.token))
            path = f"{args.base}/v1/sessions/{next(sessions)}/ticks"
            return await decide(picker, request_headers("POST", path, args.token))

        async def caller() -> None:
            while time.monotonic() < deadline:
                answers[await call()] += 1

        started = time.monotonic()
        await asyncio.gather(*(caller() for _ in range(args.concurrency)))
        elapsed = time.monotonic() - started
    print(json.dumps({"calls": sum(answers.values()), "seconds": elapsed, "answers": dict(answers)}))


if __name__ == "__main__":
    asyncio.run(main())
