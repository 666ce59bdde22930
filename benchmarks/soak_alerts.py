"""What whoever runs the system sees of a soak's faults (issue 40 item 6): the alert episodes a real
Prometheus evaluating the chart's rules holds while faults come and go (`AlertWatch`), the faults a soak holds
until the alert that tells of them fires (`SUSTAINED_FAULTS`, `wait_fired`), and the report of both.
`benchmarks/soak.py` runs them."""

from __future__ import annotations

import collections
import contextlib
import datetime
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from ardiff.devcluster.prometheus import Prometheus

ALERT_WINDOW = 120.0  # an alert a fault should raise becomes active within this, and a held fault fires it
# Faults a soak holds until their alert fires (each after every session is Ready again): Redis paused (the
# operator's rounds fail on the store), and every worker cut from Redis (their sessions Lost, with nowhere to
# go). The others heal by themselves within seconds (a killed process is started again; a worker paused past
# its lease is fenced and its sessions move) and harm no session for as long as an alert's `for`.
SUSTAINED_FAULTS = (
    ("redis-pause", "ArdiffPlacementStoreUnreachable"),
    ("worker-partition", "ArdiffSessionsLost"),
)


@dataclass(frozen=True, order=True)
class AlertEpisode:
    """An alert (its name and labels) from when it became active (`activeAt`, wall clock), and whether it was
    seen firing (its `for` passed) or only pending."""

    alert: str
    active_at: float
    fired: bool


@dataclass(frozen=True)
class SustainedFault:
    """A fault held from `started` (`time.time()`) until `alert` fired for the soak's pool: seconds from its
    start (None: not within `ALERT_WINDOW`)."""

    kind: str
    alert: str
    started: float
    fired_after: float | None


class AlertWatch(threading.Thread):
    """Polls a Prometheus that evaluates the chart's rules every second: each alert episode seen that became
    active once it watched (not one left from setting up: sessions pending while they were created)."""

    def __init__(self, prometheus: Prometheus | None) -> None:
        super().__init__(daemon=True, name="soak-alerts")
        self.prometheus = prometheus
        self.episodes: dict[tuple[str, float], bool] = {}  # (alert, activeAt) -> seen firing
        self._stopping = threading.Event()

    def run(self) -> None:
        assert self.prometheus is not None
        since = time.time()
        while not self._stopping.wait(1.0):
            with contextlib.suppress(httpx.HTTPError, RuntimeError):
                for alert in self.prometheus.alerts():
                    labels = alert["labels"]
                    named = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "alertname")
                    key = (f"{labels['alertname']}{{{named}}}", alert_time(alert["activeAt"]))
                    if key[1] >= since:
                        self.episodes[key] = self.episodes.get(key, False) or alert["state"] == "firing"

    def stop(self) -> list[AlertEpisode]:
        self._stopping.set()
        if self.ident is not None:  # started
            self.join(timeout=30)
        return sorted(AlertEpisode(a, at, fired) for (a, at), fired in self.episodes.items())


def alert_time(active_at: str) -> float:
    """Prometheus's `activeAt` (RFC 3339, nanoseconds) as `time.time()`."""
    whole, _, fraction = active_at.rstrip("Z").partition(".")
    moment = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.UTC)
    return moment.timestamp() + float(f"0.{fraction or 0}")


def wait_fired(prometheus: Prometheus, alert: str, pool: str, since: float) -> float | None:
    """Seconds from `since` (`time.time()`) until `alert` of `pool`, become active after `since`, fires;
    None when it has not within `ALERT_WINDOW`."""
    while (waited := time.time() - since) < ALERT_WINDOW:
        with contextlib.suppress(httpx.HTTPError, RuntimeError):  # a scrape or query that failed: next poll
            for found in prometheus.alerts():
                labels = found["labels"]
                if (labels.get("alertname"), labels.get("pool"), found["state"]) != (alert, pool, "firing"):
                    continue
                if alert_time(found["activeAt"]) >= since:
                    return waited
        time.sleep(0.5)
    return None


def print_alerts(
    alerts: Sequence[AlertEpisode],
    injected: Sequence[tuple[float, str]],
    quiet_until: float,
    menu: Sequence[str],
    held: Sequence[SustainedFault] = (),
) -> None:
    """Each alert's episodes (how many fired), and each kind of fault of `menu` with the alerts that became
    active after one of its faults (`injected`: start, kind) and before the next, or the first `held` fault
    (within `ALERT_WINDOW`)."""
    quiet = [a for a in alerts if a.active_at < quiet_until]
    print(f"\nalerts (the chart's rules, a real Prometheus): {len(alerts)} episodes, {len(quiet)} quiet")
    header = f"{'alert':<72} {'episodes':>8} {'fired':>5}"
    print(header)
    print("-" * len(header))
    for alert in sorted({e.alert for e in alerts}):
        episodes = [e for e in alerts if e.alert == alert]
        print(f"{alert:<72} {len(episodes):8d} {sum(e.fired for e in episodes):5d}")
    followed: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    held_from = min((fault.started for fault in held), default=float("inf"))
    for (at, kind), (until, _) in zip(injected, [*injected[1:], (held_from, "")], strict=True):
        raised = {e.alert.split("{")[0] for e in alerts if at <= e.active_at < min(until, at + ALERT_WINDOW)}
        followed[kind].update(raised)
    header = f"{'fault':<18} {'injected':>8}  alerts active after one, before the next fault (episodes)"
    print(f"\n{header}\n{'-' * len(header)}")
    for kind in menu:
        count = sum(1 for _, k in injected if k == kind)
        raised = ", ".join(f"{alert} {n}" for alert, n in sorted(followed[kind].items()))
        print(f"{kind:<18} {count:8d}  {raised or 'none'}")


def print_sustained(held: Sequence[SustainedFault]) -> None:
    """Each fault held until its alert fired, and after how long (`never`: not within `ALERT_WINDOW`)."""
    header = f"{'held fault':<18} {'alert':<34} {'fired after s':>13}"
    print(f"\n{header}\n{'-' * len(header)}")
    for fault in held:
        after = "never" if fault.fired_after is None else f"{fault.fired_after:.1f}"
        print(f"{fault.kind:<18} {fault.alert:<34} {after:>13}")
