"""Schemathesis over the worker's own OpenAPI schema: generated requests never get a 5xx, every error is the
JSON envelope, and every answer conforms to the documented status codes and media types.

Two real workers: the real runner in standalone mode (fuzzed ticks reach LingBot's own pre-process and, when
valid, the forward), and the fake runtime in placement mode (auth, placement and record checks).
"""

from __future__ import annotations

import uuid

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.slow

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
FUZZ = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.fixture(scope="module")
def real_worker(launch_worker, tiny_model_dir):
    # `--model DIR`: a checkpoint directory, as in production (written by `ardiff worker make-tiny-model`)
    process = launch_worker(
        runtime="vllm", model=tiny_model_dir, cpu_free_memory_bytes=1 << 30, ready_timeout=240
    )
    yield process
    process.stop()


@pytest.fixture(scope="module")
def placed_worker(launch_worker, redis_url):
    process = launch_worker(
        runtime="fake", redis_url=redis_url, pool=f"wk-fuzz-{uuid.uuid4().hex[:6]}", pod_name="fuzz-pod"
    )
    yield process
    process.stop()


def fuzz_every_operation(url: str) -> list[str]:
    """Up to 50 generated requests per operation of the worker's schema; returns the operations covered.

    (schemathesis' lazy `from_fixture` loader needs a pytest private attribute that pytest 9 removed, so the
    schema is loaded here and each operation's strategy driven with Hypothesis directly.)
    """
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    covered = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @FUZZ
        @given(case=operation.as_strategy())
        def exercise(case) -> None:
            response = case.call_and_validate(base_url=url, checks=CHECKS)
            if response.status_code >= 400:
                error = response.json()["error"]
                assert {"code", "message", "type", "param"} <= error.keys()

        exercise()
        covered.append(f"{operation.method.upper()} {operation.path}")
    return covered


EXPECTED_OPERATIONS = {
    "POST /v1/sessions/{session_id}/ticks",
    "DELETE /v1/sessions/{session_id}",
    "POST /v1/sessions/{session_id}/reset",
    "POST /v1/sessions/{session_id}/rewind",
    "GET /v1/sessions/{session_id}",
    "GET /v1/sessions",
    "GET /healthz",
    "GET /readyz",
    "GET /metrics",
}


def test_real_runner_standalone_never_answers_5xx(real_worker):
    assert set(fuzz_every_operation(real_worker.url)) == EXPECTED_OPERATIONS


def test_placement_mode_never_answers_5xx(placed_worker):
    assert set(fuzz_every_operation(placed_worker.url)) == EXPECTED_OPERATIONS
