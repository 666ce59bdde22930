"""The warm-up (issue 25, compute admission): forwards of a throwaway session at the pool's resolution
before the pod registers (or, standalone, is ready), so that its first registration carries its tick time.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ardiff.worker.conditioning import Conditioning
from ardiff.worker.families import ModelFamily
from ardiff.worker.messages import EXAMPLE_TICK, TickBody
from ardiff.worker.playout import TickEstimate
from ardiff.worker.pod_state import ForwardThread
from ardiff.worker.runtime import SessionRuntime, run_tick

log = logging.getLogger(__name__)

# The throwaway session whose forwards measure the tick time before the pod registers (compute admission).
WARM_UP_SESSION = "ardiff-warm-up"
WARM_UP_CHUNKS = 3  # a session's first chunk is shorter; the two after it are full


async def warm_up(
    runtime: SessionRuntime, family: ModelFamily, forward: ForwardThread, estimate: TickEstimate
) -> None:
    """Forwards of a throwaway session at the pool's resolution, closed after, so that the pod's first
    registration carries its tick time: LingBot ticks (the schema's example). A family whose ticks are
    another body (DreamZero's carry an observation) is measured by its real ticks only."""
    if not issubclass(family.tick_body, TickBody):
        return
    conditioning = Conditioning(seed=0, prompt="warm-up")
    try:
        for index in range(WARM_UP_CHUNKS):
            body = {**EXAMPLE_TICK, "request_id": f"{WARM_UP_SESSION}-{index}", "chunk_index": index}
            prepared = await asyncio.to_thread(
                runtime.ticks.prepare, family.parse_tick(WARM_UP_SESSION, body), conditioning
            )
            async with forward.lock.hold():
                started = time.perf_counter()
                output = await forward.run(run_tick, runtime, prepared)
                busy = time.perf_counter() - started
            if index > 0:
                estimate.add(busy, len(output.frames))
    finally:
        async with forward.lock.hold():
            await forward.run(runtime.close, WARM_UP_SESSION)
    log.info("warm-up: %.1f ms per full chunk", estimate.tick_s * 1000)
