"""The worker's Prometheus metrics (`ardiff_` prefix), in a registry of its own per app."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ardiff.worker.playout import Delivery
from ardiff.worker.runtime import SessionRuntime

# Ticks take ~0.1 s (tiny model on CPU) to a few seconds (the real model at 480x832).
_TICK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# A 12-frame chunk plays for 0.75 s at 16 FPS: gaps around that are on target, well over it are stalls.
_GAP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


@dataclass
class WorkerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.tick_latency = Histogram(
            "ardiff_tick_latency_seconds",
            "Time from a tick's arrival to its frames being ready, by stage",
            ["stage"],
            buckets=_TICK_BUCKETS,
            registry=r,
        )
        self.ticks = Counter("ardiff_ticks", "Ticks answered with frames", registry=r)
        self.frames = Counter("ardiff_frames", "Frames generated (rate = frames/s)", registry=r)
        self.errors = Counter(
            "ardiff_tick_errors", "Requests answered with an error, by code", ["code"], registry=r
        )
        self.evictions = Counter(
            "ardiff_session_evictions",
            "Sessions released on this worker other than by a client, by reason",
            ["reason"],
            registry=r,
        )
        self.sessions_resident = Gauge("ardiff_sessions_resident", "Sessions the runner holds", registry=r)
        self.sessions_admitted = Gauge(
            "ardiff_sessions_admitted", "Sessions holding a slot on this worker", registry=r
        )
        self.capacity = Gauge("ardiff_session_capacity", "Sessions this worker admits", registry=r)
        self.kv_free_blocks = Gauge("ardiff_kv_free_blocks", "Free blocks of the paged KV pool", registry=r)
        self.kv_blocks = Gauge("ardiff_kv_blocks", "Blocks of the paged KV pool", registry=r)
        self.kv_shared_blocks = Gauge(
            "ardiff_kv_shared_blocks", "Blocks of the paged KV pool more than one session holds", registry=r
        )
        self.ready = Gauge("ardiff_worker_ready", "1 when the worker accepts ticks", registry=r)
        self.resumes = Counter(
            "ardiff_session_resumes",
            "Sessions resumed from the shared tier, by what they resumed from",
            ["source"],
            registry=r,
        )
        self.continuity_bytes = Counter(
            "ardiff_session_export_bytes", "Bytes of session exports written, by kind", ["kind"], registry=r
        )
        self.continuity_seconds = Histogram(
            "ardiff_session_export_seconds",
            "Time to write or import a session export, by step",
            ["step"],
            buckets=_TICK_BUCKETS,
            registry=r,
        )
        # Kept history (issue 26): chunk boundaries kept for rewinds and forks, and the memory they use.
        self.history_kept = Counter(
            "ardiff_worker_history_kept", "Chunk boundaries kept in the history", registry=r
        )
        self.history_dropped = Counter(
            "ardiff_worker_history_dropped",
            "Chunk boundaries not kept (over the history budget, or the export failed)",
            registry=r,
        )
        self.history_bytes = Gauge(
            "ardiff_worker_history_bytes", "Bytes of host memory the kept history uses", registry=r
        )
        self.rewinds = Counter("ardiff_session_rewinds", "Sessions rewound to a kept chunk", registry=r)
        # Pod-to-pod transfers of migrating sessions (issue 12): `out` on the pod that held it, `in` on the
        # pod that pulled it; a failed pull falls back to the shared tier (counted with result="failed").
        self.transfer_bytes = Counter(
            "ardiff_session_transfer_bytes",
            "Bytes of session exports moved pod to pod, by direction",
            ["direction"],
            registry=r,
        )
        self.transfer_seconds = Histogram(
            "ardiff_session_transfer_seconds",
            "Wall time of a pod-to-pod session transfer, by direction",
            ["direction"],
            buckets=_TICK_BUCKETS,
            registry=r,
        )
        self.transfers = Counter(
            "ardiff_session_transfers",
            "Pod-to-pod session transfers, by direction and result (ok, failed)",
            ["direction", "result"],
            registry=r,
        )
        self.transfers_in_progress = Gauge(
            "ardiff_session_transfers_in_progress",
            "Pod-to-pod session transfers under way, by direction",
            ["direction"],
            registry=r,
        )
        self.background_restarts = Counter(
            "ardiff_background_task_restarts",
            "Long-lived worker tasks restarted after they failed, by task",
            ["task"],
            registry=r,
        )
        self.streams_open = Gauge("ardiff_streams_open", "Open session streams (WebSockets)", registry=r)
        self.stream_closes = Counter(
            "ardiff_stream_closes",
            "Session streams closed by the worker, by close code",
            ["code"],
            registry=r,
        )

        # vllm-omni's realtime video protocol (issue 38, worker/realtime.py): the chunks its server-paced
        # streams generate, what encoding them costs and what they send.
        self.realtime_chunks = Counter(
            "ardiff_realtime_chunks", "Chunks generated for realtime video streams", registry=r
        )
        self.realtime_encode_seconds = Histogram(
            "ardiff_realtime_encode_seconds",
            "Time to encode one chunk into a fragmented MP4 segment",
            buckets=_TICK_BUCKETS,
            registry=r,
        )
        self.realtime_frames = Counter(
            "ardiff_realtime_frames", "Frames of the chunks sent on realtime video streams", registry=r
        )
        self.realtime_bytes = Counter(
            "ardiff_realtime_bytes", "Bytes of fragmented MP4 sent on realtime video streams", registry=r
        )

        # Playout (issue 25, worker/playout.py): what the viewers of this pod's sessions see.
        self.time_to_first_chunk = Histogram(
            "ardiff_worker_time_to_first_chunk_seconds",
            "Time from a session's first tick on this pod to its first chunk",
            buckets=_TICK_BUCKETS,
            registry=r,
        )
        self.chunk_gap = Histogram(
            "ardiff_worker_chunk_gap_seconds",
            "Time between a session's consecutive chunks",
            buckets=_GAP_BUCKETS,
            registry=r,
        )
        self.chunks_on_time = Counter(
            "ardiff_worker_chunks_on_time", "Chunks delivered by their playout deadline", registry=r
        )
        self.chunks_late = Counter(
            "ardiff_worker_chunks_late", "Chunks delivered after their playout deadline", registry=r
        )
        self.stall_seconds = Counter(
            "ardiff_worker_stall_seconds",
            "Seconds viewers' buffers ran dry (late chunks: delivered minus deadline)",
            registry=r,
        )
        self.playback_ratio = Gauge(
            "ardiff_worker_playback_ratio",
            "Continuous-playback ratio over this pod's playing sessions (1 - stall / time played; 1: none)",
            registry=r,
        )
        self.tick_seconds = Gauge(
            "ardiff_worker_tick_seconds",
            "Estimated forward time of a full chunk (median of the recent ones; 0: none yet)",
            registry=r,
        )
        self.compute_fps = Gauge(
            "ardiff_worker_compute_fps",
            "Frames/s this pod may be asked for: compute_utilisation x measured throughput (0: not limited)",
            registry=r,
        )

    def delivered(self, delivery: Delivery) -> None:
        """One chunk delivered (worker/playout.py `SessionPlayout.delivered`)."""
        if delivery.first_chunk_s is not None:
            self.time_to_first_chunk.observe(delivery.first_chunk_s)
        if delivery.gap_s is not None:
            self.chunk_gap.observe(delivery.gap_s)
        if delivery.late is True:
            self.chunks_late.inc()
            self.stall_seconds.inc(delivery.stall_s)
        elif delivery.late is False:
            self.chunks_on_time.inc()

    def render(
        self, runtime: SessionRuntime | None, *, admitted: int, ready: bool, playback_ratio: float
    ) -> bytes:
        """The exposition text, with the gauges refreshed from the runtime's snapshots."""
        self.playback_ratio.set(playback_ratio)
        if runtime is not None:
            blocks = runtime.kv_blocks()
            self.sessions_resident.set(len(runtime.resident_sessions()))
            self.kv_free_blocks.set(blocks.free)
            self.kv_blocks.set(blocks.total)
            self.kv_shared_blocks.set(blocks.shared)
        self.sessions_admitted.set(admitted)
        self.ready.set(1 if ready else 0)
        return generate_latest(self.registry)
