"""Model families in the control plane (issue 15 item 5), without a cluster: the pipeline -> family map the
operator reads (and the worker's family modules agree with), the session's `spec.family`, and the
`FamilyMismatch` admission check."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ardiff.model_families import FAMILY_NAMES, PIPELINE_FAMILIES, family_of, pipelines_of
from ardiff.operator.admission import AdmissionFailure, check_family
from ardiff.operator.specs import InvalidSpec, ModelSpec, SessionResourceSpec
from ardiff.operator.status import Reason
from ardiff.operator.views import PoolView, SessionView


def pool(pipeline: str | None) -> PoolView:
    model = {"name": "m"} if pipeline is None else {"name": "m", "pipeline": pipeline}
    return PoolView.from_body(
        {"metadata": {"namespace": "ns", "name": "arms"}, "spec": {"image": "w:1", "model": model}}
    )


def session(**spec: object) -> SessionView:
    return SessionView.from_body(
        {"metadata": {"namespace": "ns", "name": "s"}, "spec": {"poolRef": "arms", "prompt": "", **spec}}
    )


def test_the_map_is_the_worker_families_own() -> None:
    from ardiff.worker.families import family_for, family_names

    assert FAMILY_NAMES == family_names() == ("lingbot", "dreamzero")
    for pipeline, name in PIPELINE_FAMILIES.items():
        assert family_for(pipeline).name == name
        assert pipeline in pipelines_of(name)
    assert family_of("SomeOtherPipeline") is None
    assert ModelSpec().family == "lingbot"
    assert ModelSpec(pipeline="DreamZeroPipeline").family == "dreamzero"


def test_the_operator_imports_no_family_module_and_no_torch() -> None:
    """The operator image has no torch, pydantic-based worker code or Pillow: it reads the light map only."""
    code = (
        "import sys, ardiff.operator.handlers, ardiff.operator.admission; "
        "print(sorted(m for m in ('torch', 'PIL', 'ardiff.worker.families', 'ardiff.worker.messages') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_session_family_defaults_to_lingbot_and_is_checked() -> None:
    assert session().spec is not None
    assert session().spec.family == "lingbot"
    assert session(family="dreamzero").spec.family == "dreamzero"
    with pytest.raises(
        InvalidSpec, match=r"spec.family must be one of \['lingbot', 'dreamzero'\], got 'sora'"
    ):
        SessionResourceSpec.from_resource({"poolRef": "arms", "family": "sora"})


@pytest.mark.parametrize(
    ("pipeline", "family", "fails"),
    [
        (None, "lingbot", False),  # the pool's default pipeline is LingBot-World's
        (None, "dreamzero", True),
        ("DreamZeroPipeline", "dreamzero", False),
        ("DreamZeroPipeline", "lingbot", True),
        ("SomeOtherPipeline", "dreamzero", False),  # no family to compare with: its workers refuse to load
    ],
)
def test_check_family(pipeline: str | None, family: str, fails: bool) -> None:
    if not fails:
        check_family(session(family=family), pool(pipeline))
        return
    with pytest.raises(AdmissionFailure) as failure:
        check_family(session(family=family), pool(pipeline))
    assert failure.value.reason == Reason.FAMILY_MISMATCH == "FamilyMismatch"
    pool_family = "lingbot" if family == "dreamzero" else "dreamzero"
    assert failure.value.message.startswith(
        f"session family {family!r} differs from pool arms's family {pool_family!r} (its model.pipeline "
    )
