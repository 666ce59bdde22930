"""The alerting rules and the dashboard (issue 40 item 6; charts/ardiff/monitoring/): promtool reads the rules
and their unit tests pass (tests/chart/alerts_test.yaml: every alert fires on its fault, with its words, and
not on the healthy series beside it); every series they and the dashboard query is one our code exports;
the chart ships the same rules as a PrometheusRule where the Prometheus Operator's CRD is served, and the
dashboard as a ConfigMap for Grafana's sidecar."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ardiff.wire import ErrorCode
from tests.chart.conftest import ROOT

MONITORING = ROOT / "charts" / "ardiff" / "monitoring"
RULES = MONITORING / "alerts.rules.yaml"
DASHBOARD = MONITORING / "dashboard.json"
RULE_TESTS = Path(__file__).with_name("alerts_test.yaml")
# Where our metrics are declared (each a prometheus_client Counter, Gauge or Histogram).
METRICS_MODULES = ("worker/metrics.py", "operator/metrics.py", "ardiff/gateway/picker.py")
PROMETHEUS_RULE_API = "monitoring.coreos.com/v1/PrometheusRule"


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary is not None, "promtool (Debian's prometheus package) is installed by `make packages`"
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True, check=False, timeout=120)


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def exported_series() -> set[str]:
    """Every series name our code exports: a counter's `_total`, a histogram's `_bucket`, `_sum`, `_count`."""
    declared = re.compile(r"\b(Counter|Gauge|Histogram)\(\s*\"(ardiff_\w+)\"")
    names: set[str] = set()
    for module in METRICS_MODULES:
        for kind, name in declared.findall((ROOT / module).read_text()):
            if kind == "Counter":
                names.add(name if name.endswith("_total") else f"{name}_total")
            elif kind == "Histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            else:
                names.add(name)
    return names


def queried_series(expression: str) -> set[str]:
    return set(re.findall(r"\b(ardiff_\w+)\b", expression))


def dashboard_queries(values: dict[str, str] | None = None) -> list[str]:
    """Every panel's query and every variable's definition; with `values`, the panels' queries only, each
    variable (`$namespace`) replaced by its value, as Grafana sends them to Prometheus."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    if values is not None:
        for variable, value in values.items():
            queries = [query.replace(variable, value) for query in queries]
        return queries
    variables = dashboard["templating"]["list"]
    queries += [variable["definition"] for variable in variables if "definition" in variable]
    return queries


def test_promtool_reads_the_rules_and_their_unit_tests_pass() -> None:
    checked = promtool("check", "rules", RULES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout
    tested = promtool("test", "rules", RULE_TESTS)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_has_a_case_that_fires_it_and_names_what_to_look_at() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {case["alertname"] for test in cases for case in test["alert_rule_test"] if case["exp_alerts"]}
    alerts = {rule["alert"] for rule in rules()}
    assert alerts == fired
    assert len(alerts) == len(rules())  # one rule per alert name
    for rule in rules():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
        assert re.fullmatch(r"\d+m", rule["for"]), rule["alert"]  # no alert on one scrape's blip


def test_every_series_the_rules_and_the_dashboard_query_is_exported() -> None:
    exported = exported_series()
    assert {"ardiff_pool_reconcile_failures_total", "ardiff_tick_latency_seconds_bucket"} <= exported
    for expression in [rule["expr"] for rule in rules()] + dashboard_queries():
        assert queried_series(expression), expression
        assert queried_series(expression) <= exported, expression


def test_the_front_doors_error_alert_counts_exactly_the_5xx_codes() -> None:
    (rule,) = [rule for rule in rules() if rule["alert"] == "ArdiffFrontDoorErrors"]
    (codes,) = re.findall(r'outcome=~"([^"]+)"', rule["expr"])
    assert set(codes.split("|")) == {code.code for code in ErrorCode if code.status >= 500}


def test_the_dashboards_panels_and_variables_hold_together() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace", "pool"}
    for panel in panels:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        used = set(re.findall(r"\$(\w+)", " ".join(target["expr"] for target in panel["targets"])))
        assert used <= variables, panel["title"]


@pytest.mark.parametrize("served", [True, False], ids=["operator-crd-served", "no-operator-crd"])
def test_the_chart_ships_the_rules_as_a_prometheus_rule_where_the_crd_is_served(chart, served: bool) -> None:
    values = {"monitoring": {"prometheusRule": {"labels": {"release": "prom"}}}}
    args = ("--api-versions", PROMETHEUS_RULE_API) if served else ()
    objects = chart.render(values, *args)
    found = [obj for obj in objects if obj["kind"] == "PrometheusRule"]
    if not served:
        assert found == []
        return
    (rule,) = found
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == chart.namespace
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    disabled = {"monitoring": {"prometheusRule": {"enabled": False}}}
    assert not [obj for obj in chart.render(disabled, *args) if obj["kind"] == "PrometheusRule"]


def test_the_chart_ships_the_dashboard_for_grafanas_sidecar(chart) -> None:
    assert not [obj for obj in chart.render() if obj["metadata"]["name"].endswith("-dashboard")]
    objects = chart.render({"monitoring": {"grafanaDashboard": {"enabled": True}}})
    (config_map,) = [obj for obj in objects if obj["metadata"]["name"] == f"{chart.fullname}-dashboard"]
    assert config_map["kind"] == "ConfigMap"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["ardiff.json"]) == json.loads(DASHBOARD.read_text())
