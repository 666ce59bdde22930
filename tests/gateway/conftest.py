"""The front door on loopback (issue 37): real Envoy and the endpoint picker (`LocalFrontDoor`) in front of
real fake-runtime workers on the shared Redis. The workers' fixtures are the worker tests' own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ardiff.devcluster.front_door import LocalFrontDoor
from tests.worker.conftest import launch_worker, placer, session_spec, store  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def front_door(redis_url: str) -> Iterator[LocalFrontDoor]:
    with LocalFrontDoor(redis_url) as door:
        yield door
