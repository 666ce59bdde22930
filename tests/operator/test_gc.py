"""`ardiff operator run` tunes Python's collector before kopf starts (operator/cli.py `tune_gc`): the
start-up's objects frozen out of the generations, the youngest one collected every 20,000 allocations."""

from __future__ import annotations

import gc

from ardiff.operator.cli import GC_THRESHOLDS, tune_gc


def test_the_operator_collects_its_youngest_generation_every_20000_allocations() -> None:
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    try:
        tune_gc()
        assert gc.get_threshold() == GC_THRESHOLDS == (20_000, 10, 10)
        assert gc.get_freeze_count() > frozen
        gc.collect(0)
        young_collections = gc.get_stats()[0]["collections"]
        kept = [[i] for i in range(5_000)]  # 5,000 container objects: 7 young collections at Python's 700
        assert gc.get_stats()[0]["collections"] == young_collections, len(kept)
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
