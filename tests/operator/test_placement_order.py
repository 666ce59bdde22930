"""The order in which a pool round places waiting sessions (docs/contracts.md §2): `lost` first, by priority
then most recent activity; then the others by priority then creation time."""

from __future__ import annotations

from typing import Any

from ardiff.kv.records import SessionBinding, SessionState
from ardiff.operator.reconcile import placement_order, waits_for_a_slot
from ardiff.operator.views import SessionView


def session(name: str, created: str, priority: int = 0, **status: Any) -> SessionView:
    return SessionView.from_body(
        {
            "metadata": {"namespace": "ns", "name": name, "creationTimestamp": created},
            "spec": {"poolRef": "pool", "prompt": "p", "priority": priority},
            "status": status,
        }
    )


def record(name: str, state: SessionState, last_tick_ms: int) -> SessionBinding:
    return SessionBinding(name, state, "", 0, True, 0, last_tick_ms)


def test_lost_sessions_go_first_by_priority_then_latest_tick() -> None:
    views = [
        session("evicted-old", "2024-01-01T00:00:00Z"),
        session("evicted-vip", "2024-01-01T00:00:01Z", priority=9),
        session("new", "2024-01-01T00:00:02Z"),
        session("lost-stale", "2024-01-01T00:00:03Z"),
        session("lost-active", "2024-01-01T00:00:04Z"),
        session("lost-vip-stale", "2024-01-01T00:00:05Z", priority=5),
    ]
    records = {
        "evicted-old": record("evicted-old", SessionState.EVICTED, 1_000),
        "evicted-vip": record("evicted-vip", SessionState.EVICTED, 9_000),
        "lost-stale": record("lost-stale", SessionState.LOST, 2_000),
        "lost-active": record("lost-active", SessionState.LOST, 5_000),
        "lost-vip-stale": record("lost-vip-stale", SessionState.LOST, 1_000),
    }
    ordered = sorted(views, key=lambda s: placement_order(s, records.get(s.name)))
    assert [s.name for s in ordered] == [
        "lost-vip-stale",  # lost: priority first...
        "lost-active",  # ...then the latest tick, whatever the creation time
        "lost-stale",
        "evicted-vip",  # others: priority, then creation time (an evicted one is not favoured by its tick)
        "evicted-old",
        "new",
    ]


def test_a_lost_session_without_a_record_ranks_by_its_status() -> None:
    """Redis lost its data: the CR's phase and lastTickTime stand in for the record."""
    older = session("lost-a", "2024-01-01T00:00:00Z", phase="Lost", lastTickTime="2024-01-01T00:01:00.000Z")
    newer = session("lost-b", "2024-01-01T00:00:01Z", phase="Lost", lastTickTime="2024-01-01T00:02:00.000Z")
    never = session("lost-c", "2024-01-01T00:00:02Z", phase="Lost")
    evicted = session("evicted", "2023-01-01T00:00:00Z", phase="Evicted")
    ordered = sorted([evicted, never, older, newer], key=lambda s: placement_order(s, None))
    assert [s.name for s in ordered] == ["lost-b", "lost-a", "lost-c", "evicted"]


def test_a_session_bound_to_a_pod_when_redis_lost_its_record_ranks_with_the_lost_ones() -> None:
    """Issue 40 (the crash walk's tier scenario): Redis lost the pool's data while sessions were Ready on a
    pod. Their status still says Ready on it: they were in use, and go before an evicted session (whose record
    went too) rather than after it by creation time — first, they may be restored on that pod with their KV,
    which a slot taken by the evicted one would prevent."""
    evicted = session("evicted", "2023-01-01T00:00:00Z", phase="Evicted")
    bound = session("bound", "2024-01-01T00:00:00Z", phase="Ready", pod="p1", podEpoch=7)
    new = session("new", "2022-01-01T00:00:00Z")
    ordered = sorted([evicted, new, bound], key=lambda s: placement_order(s, None))
    assert [s.name for s in ordered] == ["bound", "new", "evicted"]


def test_suspended_sessions_a_tick_asked_for_come_after_lost_ones() -> None:
    """Issue 12: their users are ticking; they go before new and evicted sessions, by priority then by when
    the demand came. (A suspended session without a demand is not placed at all: place_sessions skips it.)"""
    views = [
        session("new", "2024-01-01T00:00:00Z", priority=9),
        session("lost", "2024-01-01T00:00:01Z"),
        session("resume-late", "2024-01-01T00:00:02Z"),
        session("resume-early", "2024-01-01T00:00:03Z"),
        session("resume-vip", "2024-01-01T00:00:04Z", priority=3),
    ]

    def suspended(name: str, demand_ms: int) -> SessionBinding:
        return SessionBinding(name, SessionState.SUSPENDED, "", 0, False, 0, 0, resume_requested_ms=demand_ms)

    records = {
        "lost": record("lost", SessionState.LOST, 1_000),
        "resume-late": suspended("resume-late", 9_000),
        "resume-early": suspended("resume-early", 5_000),
        "resume-vip": suspended("resume-vip", 9_500),
    }
    ordered = sorted(views, key=lambda s: placement_order(s, records.get(s.name)))
    assert [s.name for s in ordered] == ["lost", "resume-vip", "resume-early", "resume-late", "new"]


def test_only_sessions_without_a_slot_are_ordered_and_placed() -> None:
    """A round orders only these (placed, suspending and closed ones, and suspended ones nobody asked for,
    are left alone)."""
    assert waits_for_a_slot(None)  # new, or Redis lost its record
    for state in (SessionState.LOST, SessionState.EVICTED):
        assert waits_for_a_slot(record("s", state, 0))
    for state in (SessionState.PLACED, SessionState.SUSPENDING, SessionState.CLOSED, SessionState.SUSPENDED):
        assert not waits_for_a_slot(record("s", state, 0))
    demanded = SessionBinding("s", SessionState.SUSPENDED, "", 0, False, 0, 0, resume_requested_ms=7)
    assert waits_for_a_slot(demanded)
