"""Scaling decisions: pure, so every rule is checked on exact inputs."""

from __future__ import annotations

from ardiff.operator.scaling import (
    MigrationPlan,
    PodSlots,
    ScalePlan,
    compute_sessions,
    may_grow,
    plan_migrations,
    plan_scaling,
)


def pods(*specs: tuple[str, bool, int, int, float | None]) -> dict[str, PodSlots]:
    return {s[0]: PodSlots(*s) for s in specs}


def plan(slots: dict[str, PodSlots], waiting: int = 0, **overrides: object) -> ScalePlan:
    args: dict[str, object] = {
        "min_replicas": 1,
        "max_replicas": 4,
        "session_capacity": None,
        "scale_down_delay": 10.0,
        "now": 100.0,
    }
    args.update(overrides)
    return plan_scaling(slots, waiting=waiting, **args)  # type: ignore[arg-type]


def test_starts_min_pods() -> None:
    assert plan({}, min_replicas=2) == ScalePlan(create=2, delete=())


def test_grows_by_the_pods_the_waiting_sessions_need() -> None:
    full = pods(("a", True, 4, 4, None))
    assert plan(full, waiting=1) == ScalePlan(create=1, delete=())
    assert plan(full, waiting=9) == ScalePlan(create=3, delete=())  # 9 sessions / 4 slots, capped at max 4
    assert plan(full, waiting=9, max_replicas=2) == ScalePlan(create=1, delete=())


def test_counts_booting_pods_as_coming_capacity() -> None:
    slots = pods(("a", True, 4, 4, None), ("b", False, 0, 0, None))
    assert plan(slots, waiting=4) == ScalePlan(create=0, delete=())
    assert plan(slots, waiting=5) == ScalePlan(create=1, delete=())


def test_unknown_capacity_grows_one_pod_at_a_time() -> None:
    assert plan(pods(("a", False, 0, 0, None)), waiting=10) == ScalePlan(create=0, delete=())
    assert plan(pods(("a", True, 0, 0, None)), waiting=10) == ScalePlan(create=1, delete=())
    assert plan(pods(("a", False, 0, 0, None)), waiting=10, session_capacity=2) == ScalePlan(
        create=4 - 1, delete=()
    )


def test_a_slot_without_compute_is_not_free_and_a_new_pod_brings_what_its_compute_admits() -> None:
    # 8 KV slots, 3 used; its compute admits 4 sessions at the pool's fps and 1 more now.
    a = PodSlots("a", True, 8, 3, None, compute_capacity=4, compute_free=1)
    assert (a.free, a.admits) == (1, 4)
    assert plan({"a": a}, waiting=1) == ScalePlan(create=0, delete=())
    full = PodSlots("a", True, 8, 4, None, compute_capacity=4, compute_free=0)
    assert full.free == 0  # 4 KV slots free, but no compute: the waiting sessions need pods
    assert plan({"a": full}, waiting=1) == ScalePlan(create=1, delete=())
    assert plan({"a": full}, waiting=6) == ScalePlan(create=2, delete=())  # 4 sessions per new pod
    booting = PodSlots("b", False, 0, 0, None)
    assert plan({"a": full, "b": booting}, waiting=4) == ScalePlan(create=0, delete=())
    assert plan({"a": full, "b": booting}, waiting=5) == ScalePlan(create=1, delete=())


def test_compute_sessions_counts_whole_sessions_with_placements_slack() -> None:
    assert compute_sessions(48.0, 16.0) == 3
    assert compute_sessions(47.9, 16.0) == 2
    assert compute_sessions(16.0 * 3 - 1e-9, 16.0) == 3  # a float sum a hair under: as placement admits it
    assert compute_sessions(-5.0, 16.0) == 0  # demand over compute (a slower measurement)


def test_does_not_grow_while_a_slot_is_free_or_at_max() -> None:
    assert plan(pods(("a", True, 4, 3, None)), waiting=2) == ScalePlan(create=0, delete=())
    at_max = pods(*[(n, True, 1, 1, None) for n in "abcd"])
    assert plan(at_max, waiting=5) == ScalePlan(create=0, delete=())


def test_shrinks_only_empty_pods_after_the_delay_and_never_below_min() -> None:
    slots = pods(("a", True, 4, 0, 80.0), ("b", True, 4, 0, 95.0), ("c", True, 4, 2, None))
    assert plan(slots) == ScalePlan(create=0, delete=("a",))  # b has been empty for 5 s only
    assert plan(slots, now=200.0) == ScalePlan(create=0, delete=("a", "b"))
    assert plan(slots, now=200.0, min_replicas=2) == ScalePlan(create=0, delete=("a",))
    assert plan(slots, now=200.0, waiting=1) == ScalePlan(create=0, delete=())  # someone waits: keep them


def test_never_deletes_a_pod_with_sessions_even_above_max() -> None:
    slots = pods(("a", True, 4, 1, None), ("b", True, 4, 0, 99.0), ("c", True, 4, 2, None))
    assert plan(slots, max_replicas=1, min_replicas=1) == ScalePlan(create=0, delete=("b",))


def test_may_grow() -> None:
    assert may_grow(pods(("a", True, 4, 4, None)), max_replicas=2)
    assert not may_grow(pods(("a", True, 4, 4, None), ("b", True, 4, 4, None)), max_replicas=2)
    assert may_grow(pods(("a", True, 4, 4, None), ("b", False, 0, 0, None)), max_replicas=2)


def test_a_stuck_pod_is_replaced_and_counts_for_nothing() -> None:
    stuck = PodSlots("a", False, 0, 0, None, stuck=True)
    # It blocked nothing: the pool is below min without it, so its successor is created in the same plan.
    assert plan({"a": stuck}) == ScalePlan(create=1, delete=(), replace=("a",))
    # It is not a booting pod that will bring slots: waiting sessions get a pod of their own.
    full = pods(("b", True, 2, 2, None))
    assert plan({**full, "a": stuck}, waiting=1) == ScalePlan(create=1, delete=(), replace=("a",))
    # At max without it the pool cannot grow, so a newcomer may evict; with it booting it could not.
    assert not may_grow({**full, "a": stuck}, max_replicas=1)
    assert may_grow({**full, "a": PodSlots("a", False, 0, 0, None)}, max_replicas=2)
    assert not may_grow({**full, "a": stuck}, max_replicas=1)


def stale(name: str, used: int, *, registered: bool = True) -> PodSlots:
    """A pod of an older template; the round drained it, so it offers no slot."""
    return PodSlots(name, registered, 0, used, None if used else 50.0, stale=True)


def test_stale_pods_go_as_soon_as_they_hold_no_session_and_are_replaced() -> None:
    # The spec changed: the empty old pod and the one still booting the old template go at once, and the
    # pool gets its min of current pods back.
    slots = {"old": stale("old", 0), "booting": stale("booting", 0, registered=False)}
    assert plan(slots) == ScalePlan(create=1, delete=("booting", "old"))
    # One that holds sessions stays (never cut a live session short) and still counts against max...
    busy = {"busy": stale("busy", 2)}
    assert plan(busy, max_replicas=1) == ScalePlan(create=0, delete=())
    assert plan(busy, max_replicas=2) == ScalePlan(create=1, delete=())
    # ... but not towards min, nor as a slot: waiting sessions get current pods, up to max.
    current = pods(("new", True, 2, 2, None))
    assert plan({**busy, **current}, waiting=3, max_replicas=4) == ScalePlan(create=2, delete=())
    assert plan({**busy, **current}, waiting=3, max_replicas=2) == ScalePlan(create=0, delete=())
    assert not may_grow({**busy, **current}, max_replicas=2)
    # Current pods scale down as before; the stale busy pod is no reason to keep one above min.
    idle = pods(("new", True, 2, 0, 10.0), ("new2", True, 2, 0, 10.0))
    assert plan({**busy, **idle}, max_replicas=3) == ScalePlan(create=0, delete=("new",))


def test_a_stuck_stale_pod_is_reported_once_as_stuck() -> None:
    both = PodSlots("old", False, 0, 0, None, stuck=True, stale=True)
    assert plan({"old": both}) == ScalePlan(create=1, delete=(), replace=("old",))


# ---- issue 12: migration instead of waiting ---------------------------------------------------------------


def pod(name: str, capacity: int, used: int, **fields: object) -> PodSlots:
    fields.setdefault("exports", True)
    return PodSlots(name, True, capacity, used, None if used else 50.0, **fields)  # type: ignore[arg-type]


def migrations(
    *slots: PodSlots, waiting: int = 0, min_replicas: int = 1, max_replicas: int = 4
) -> MigrationPlan:
    return plan_migrations(
        {p.name: p for p in slots}, waiting=waiting, min_replicas=min_replicas, max_replicas=max_replicas
    )


def test_a_roll_migrates_stale_pods_whose_sessions_fit_in_current_pods() -> None:
    new = pod("new", 4, 1)
    assert migrations(new, pod("old-a", 0, 2, stale=True), pod("old-b", 0, 2, stale=True)).roll == ("old-a",)
    # Each stale pod's sessions are counted against the free slots left.
    assert migrations(
        pod("new", 4, 0), pod("old-a", 0, 2, stale=True), pod("old-b", 0, 2, stale=True)
    ).roll == (
        "old-a",
        "old-b",
    )


def test_a_roll_waits_for_pods_that_cannot_export_or_change_the_identity() -> None:
    new = pod("new", 4, 0)
    assert migrations(new, pod("old", 0, 1, stale=True, exports=False)).roll == ()
    assert migrations(new, pod("old", 0, 1, stale=True, same_identity=False)).roll == ()


def test_a_roll_at_max_without_a_free_slot_moves_the_least_loaded_stale_pod() -> None:
    """No current pod can come (at max, none booting): its sessions wait suspended, with their KV."""
    full = (pod("old-a", 0, 2, stale=True), pod("old-b", 0, 1, stale=True))
    assert migrations(*full, max_replicas=2).roll == ("old-b",)
    assert migrations(*full, max_replicas=3).roll == ()  # a current pod can still be created: wait for it
    booting = PodSlots("new", False, 0, 0, None)
    assert migrations(*full, booting, max_replicas=3).roll == ()


def test_scale_down_moves_the_least_loaded_pod_when_it_fits_elsewhere() -> None:
    assert migrations(pod("a", 4, 1), pod("b", 4, 3)).scale_down == "a"
    assert migrations(pod("a", 4, 2), pod("b", 4, 3)).scale_down is None  # 2 > 1 free on b
    assert migrations(pod("a", 4, 1), pod("b", 4, 3), min_replicas=2).scale_down is None
    assert migrations(pod("a", 4, 1), pod("b", 4, 3), waiting=1).scale_down is None
    assert migrations(pod("a", 4, 1, exports=False), pod("b", 4, 3)).scale_down is None
    assert (
        migrations(pod("a", 4, 1), pod("b", 4, 3), pod("c", 4, 0)).scale_down is None
    )  # c goes by the delay
    assert migrations(pod("a", 4, 1), pod("b", 4, 3), pod("c", 0, 1, stale=True)).scale_down is None
