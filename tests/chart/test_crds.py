"""The chart ships the repository's CRDs, and its custom resources pass them (OpenAPI + CEL) on the session's
real API server (server-side dry-run; the server serves crds/, which the first test keeps identical to the
chart's copies)."""

from __future__ import annotations

from tests.conftest import Admission

# Rendered kinds that our CRDs serve (ServiceMonitor is the Prometheus Operator's; see test_chart.py).
OUR_KINDS = {"ARDiffusionWorkerPool", "KopfPeering", "ClusterKopfPeering"}


def test_chart_crds_are_byte_identical_to_the_top_level_crds(chart):
    top_level = {path.name: path.read_bytes() for path in (chart.path.parents[1] / "crds").glob("*")}
    shipped = {path.name: path.read_bytes() for path in (chart.path / "crds").glob("*")}
    assert sorted(shipped) == sorted(top_level)
    for name, content in top_level.items():
        assert shipped[name] == content, f"charts/ardiff/crds/{name} differs from crds/{name}: copy it again"


def test_rendered_custom_resources_pass_the_crds(chart, variant, admission: Admission):
    custom = [obj for obj in chart.render(variant) if obj["kind"] in OUR_KINDS]
    assert custom  # at least the peering object
    for obj in custom:
        stored = admission.create(obj)
        assert stored.admitted, (obj["kind"], stored.body)
        assert stored.pruned == []  # nothing the chart renders is silently dropped


def test_a_bad_default_pool_spec_is_rejected_like_the_apiserver_would(chart, admission: Admission):
    values = {"defaultPool": {"enabled": True, "spec": {"replicas": {"min": 3, "max": 1}}}}
    [pool] = [obj for obj in chart.render(values) if obj["kind"] == "ARDiffusionWorkerPool"]
    refused = admission.create(pool)
    assert refused.code == 422
    assert refused.errors == ["spec.replicas.max: Invalid value: max must be >= min"]
