"""The trained tiny world (issue 16): the yaw-only ray-caster, and the shipped `tiny-world-trained` checkpoint
through the worker's normal load path (`build_settings` resolves the name, `load_vllm_runtime` loads it)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import PIL.Image
import pytest

from ardiff.tiny_world import world
from ardiff.worker.settings import TRAINED_WORLD_MODEL, build_settings


@pytest.fixture(scope="module")
def vllm_omni_ready() -> None:
    from ardiff.worker.settings import DEFAULT_CPU_FREE_MEMORY_BYTES
    from ardiff.worker.vllm_runtime import prepare_vllm_omni

    prepare_vllm_omni(cpu_free_memory_bytes=DEFAULT_CPU_FREE_MEMORY_BYTES)


def test_the_ray_caster_is_deterministic() -> None:
    assert np.array_equal(world.render(0.3), world.render(0.3))
    assert world.render(0.0).shape == (world.HEIGHT, world.WIDTH, 3)
    assert not np.array_equal(world.render(0.0), world.render(0.1))


@pytest.mark.parametrize(("key", "direction"), [("j", +1), ("l", -1), (None, 0)])
def test_turning_left_moves_the_picture_right_and_right_left(vllm_omni_ready, key, direction) -> None:
    """LingBot's own integration turns 6 degrees per latent frame: one latent cell (8 px) at the centre."""
    frames = world.render_session(world.held_actions(key, 2))
    assert frames.shape == (9 + 12, world.HEIGHT, world.WIDTH, 3)
    assert np.array_equal(frames, world.render_session(world.held_actions(key, 2)))
    shifts = [world.horizontal_shift(frames[i], frames[i + 4]) for i in range(1, len(frames) - 4, 4)]
    assert all(np.sign(shift) == direction for shift in shifts), shifts
    if direction:
        assert all(7 <= abs(shift) <= 9 for shift in shifts), shifts


def test_the_shift_measure_reads_blurred_noisy_turns_and_no_move_where_there_is_none(vllm_omni_ready) -> None:
    """The quality benchmark's turn check reads generated frames, which are never sharp: the shift measure
    must read a blurred, noisy copy of the true frames as the sharp ones (phase correlation read most of them
    as 0 px), and a still or flat picture as no move (0 counts as a wrong turn)."""
    from scipy.ndimage import gaussian_filter

    noise = np.random.default_rng(0)
    for key, direction in (("j", +1), ("l", -1)):
        frames = world.render_session(world.held_actions(key, 2)).astype(np.float64)
        blurred = gaussian_filter(frames, (0, 2, 2, 0)) + 20 * noise.standard_normal(frames.shape)
        for first, last in ((0, 8), (8, 20), (4, 16)):
            sharp = world.horizontal_shift(frames[first], frames[last])
            assert np.sign(sharp) == direction
            assert abs(world.horizontal_shift(blurred[first], blurred[last]) - sharp) <= 1
    still = gaussian_filter(world.render(0.3).astype(np.float64), (2, 2, 0))
    assert world.horizontal_shift(still, still + 20 * noise.standard_normal(still.shape)) == 0
    flat = np.full((world.HEIGHT, world.WIDTH, 3), 128, dtype=np.uint8)
    assert world.horizontal_shift(flat, flat) == 0


def test_the_nearest_true_view_finds_where_a_blurred_noisy_picture_looks() -> None:
    """The benchmark's second reading of a turn: `nearest_yaw` finds the yaw of a blurred, noisy true view to
    within a degree on its 1-degree grid, all the way round (the sky hue and the pillars tell them apart)."""
    from scipy.ndimage import gaussian_filter

    noise = np.random.default_rng(1)
    for degrees in (-170.0, -48.0, -6.0, 0.0, 30.0, 97.0, 179.0):
        view = gaussian_filter(world.render(np.radians(degrees)).astype(np.float64), (2, 2, 0))
        view += 20 * noise.standard_normal(view.shape)
        found = np.degrees(world.nearest_yaw(view))
        assert abs((found - degrees + 180) % 360 - 180) <= 1, (degrees, found)


def test_the_name_resolves_to_the_shipped_checkpoint() -> None:
    settings = build_settings({"model": TRAINED_WORLD_MODEL}, environ={})
    assert settings.model.endswith("models/tiny-world-trained")
    from ardiff.worker.families import lingbot

    assert lingbot.checkpoint_ok(Path(settings.model))
    assert sum(f.stat().st_size for f in Path(settings.model).rglob("*") if f.is_file()) <= 25 << 20


@pytest.mark.slow
def test_the_shipped_checkpoint_loads_and_ticks(tmp_path) -> None:
    from ardiff.worker import tick_rules
    from ardiff.worker.conditioning import Conditioning, conditioning_image
    from ardiff.worker.runtime import run_tick
    from ardiff.worker.vllm_runtime import load_vllm_runtime

    adapter = load_vllm_runtime(
        build_settings({"model": TRAINED_WORLD_MODEL, "model_cache": str(tmp_path)}, environ={})
    )
    try:
        png = io.BytesIO()
        PIL.Image.fromarray(world.start_image()).save(png, format="PNG")
        picture = conditioning_image(png.getvalue(), 0, world.HEIGHT, world.WIDTH)
        conditioning = Conditioning(seed=0, prompt=world.PROMPT, picture=picture)
        control = {
            "track": "camera",
            "schema": "lingbot.camera_actions.v1",
            "data": {"mode": "frames", "frames": [[], ["j"], ["j"]]},
        }
        tick = tick_rules.parse_tick("w", {"request_id": "w-0", "chunk_index": 0, "controls": [control]})
        chunk = run_tick(adapter, adapter.ticks.prepare(tick, conditioning))
        assert chunk.frames.shape == (9, world.HEIGHT, world.WIDTH, 3)
        assert chunk.frames.std() > 5  # a picture, not a flat field
    finally:
        adapter.shutdown()


def test_the_turn_weight_marks_exactly_the_latent_frames_whose_yaw_changes(vllm_omni_ready) -> None:
    """`train-tiny-world --turn-weight` weighs the latent frames `turning_frames` marks: those where LingBot's
    own action integration moves the yaw from the previous latent frame (held-key sessions as in training)."""
    from ardiff.tiny_world.data import N_CHUNKS, turning_frames

    rng = np.random.default_rng(5)
    sessions = [world.sample_actions(rng, N_CHUNKS) for _ in range(6)] + [world.held_actions("j", N_CHUNKS)]
    actions = np.asarray([[["".join(keys) for keys in chunk] for chunk in s] for s in sessions], dtype="<U2")
    marked = turning_frames(actions)
    assert marked.shape == (7, 3 * N_CHUNKS)
    for row, chunks in zip(marked, sessions, strict=True):
        yaws = world.latent_yaws(chunks)
        moved = np.abs(np.diff(yaws)) > 1e-6
        assert row[0] == 0.0  # the start image
        assert np.array_equal(row[1:], moved.astype(np.float64)), (row, yaws)
    assert marked[-1].sum() == 3 * N_CHUNKS - 1  # hold `j`: every latent frame after the start turns
    assert 0 < marked[:-1].mean() < 1


def test_long_turns_add_far_turning_sessions_and_never_a_held_out_case() -> None:
    """`train-tiny-world --long-turns N`: the --sessions random sessions are the seed's `sample_actions`
    stream (unchanged by N), then N sessions that turn one way with pauses, reaching far from the start more
    often than held-key turning does; none of them is the benchmark's held-out hold-`j`/hold-`l` session."""
    from ardiff.tiny_world.data import N_CHUNKS, training_actions

    held = [world.held_actions(key, N_CHUNKS) for key in ("j", "l")]
    plain = training_actions(40, 7)
    mixed = training_actions(40, 7, long_turns=200)
    assert len(plain) == 40
    assert len(mixed) == 240
    assert mixed[:40] == plain
    rng = np.random.default_rng(7)
    stream = [world.sample_actions(rng, N_CHUNKS) for _ in range(60)]
    assert any(chunks in held for chunks in stream)  # seed 7 draws one: training skips it
    assert plain == [chunks for chunks in stream if chunks not in held][:40]
    assert not any(chunks in held for chunks in mixed)

    def max_yaw_frames(chunks: list[list[list[str]]]) -> int:
        steps = [{"j": -1, "l": 1}.get("".join(keys), 0) for chunk in chunks for keys in chunk]
        return int(np.abs(np.cumsum(steps)).max())

    for chunks in mixed[40:]:
        assert len(chunks) == N_CHUNKS
        assert all(len(chunk) == 3 for chunk in chunks)
        assert chunks[0][0] == []  # the start image
        assert all(keys in ([], ["j"], ["l"]) for chunk in chunks for keys in chunk)
    far = np.mean([max_yaw_frames(c) >= 8 for c in mixed[40:]])  # >= 48 degrees from the start
    assert far > 0.4
    assert far > 2 * np.mean([max_yaw_frames(c) >= 8 for c in training_actions(200, 7)])


def test_the_quality_cases_are_never_sessions_the_shipped_model_was_trained_on(tmp_path) -> None:
    """The shipped checkpoint records the options its training sessions were drawn with (`training.json`);
    `held_out_cases` (the quality benchmark's) skips every one of them, so its random cases are held out: with
    seed 1000 some draws are training sessions, and exactly those are replaced by later draws."""
    from ardiff.tiny_world.data import N_CHUNKS, trained_on, training_actions, write_training_record
    from ardiff.worker.settings import resolve_model

    trained = trained_on(Path(resolve_model(TRAINED_WORLD_MODEL)))
    assert trained == training_actions(384, 7, long_turns=576)
    held_out, skipped = world.held_out_cases(12, 1000, N_CHUNKS, trained)
    assert [name for name, _ in held_out[:2]] == ["hold-j", "hold-l"]
    assert len(held_out) == 12
    assert not any(actions in trained for _, actions in held_out)
    assert len({str(actions) for _, actions in held_out}) == 12
    # The random cases are the seed's stream of draws, less exactly the training sessions in it.
    rng = np.random.default_rng(1000)
    kept, passed_over = [], 0
    while len(kept) < 10:
        actions = world.sample_actions(rng, N_CHUNKS)
        if actions in trained:
            passed_over += 1
        else:
            kept.append(actions)
    assert [actions for _, actions in held_out[2:]] == kept
    assert skipped == passed_over > 0
    unchecked, none_skipped = world.held_out_cases(12, 1000, N_CHUNKS, [])
    assert none_skipped == 0
    assert sum(actions in trained for _, actions in unchecked) > 0  # without the record, some were trained on

    write_training_record(tmp_path, sessions=5, seed=3, long_turns=2)
    assert trained_on(tmp_path) == training_actions(5, 3, long_turns=2)
    assert trained_on(tmp_path / "elsewhere") is None
