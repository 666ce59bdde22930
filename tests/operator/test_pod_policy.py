"""The operator is nobody's deputy (issue 23 item 7): what a pool's template may not carry is refused before
any Pod is made, and a session's image reads only Secrets labelled for it."""

from __future__ import annotations

import asyncio
import base64

import pytest

from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId
from ardiff.operator.admission import SESSION_IMAGE_LABEL
from ardiff.operator.config import OperatorConfigError, config_from_env
from ardiff.operator.pod_policy import RESTRICTED_VOLUME_TYPES, PodTemplatePolicy
from ardiff.operator.specs import PodOptions
from tests.operator.conftest import Cluster

HOSTILE_TEMPLATE = {
    "volumes": [
        {"name": "scratch", "emptyDir": {}},
        {"name": "host", "hostPath": {"path": "/etc"}},
    ],
    "serviceAccountName": "deployer",
    "securityContext": {"runAsUser": 0},
}
REFUSALS = [
    "spec.volumes[1] (host): volume type hostPath is not allowed (allowed: "
    + ", ".join(sorted(RESTRICTED_VOLUME_TYPES))
    + ")",
    "spec.serviceAccountName deployer is not allowed (allowed: default)",
    "spec.securityContext.runAsUser 0 (root) is not allowed",
]


def test_the_policy_names_each_refused_field_and_allows_the_rest() -> None:
    policy = PodTemplatePolicy()
    assert policy.violations(PodOptions.from_resource(HOSTILE_TEMPLATE)) == REFUSALS
    allowed = {
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "worlds"}}],
        "serviceAccountName": "default",
        "securityContext": {"runAsUser": 1000},
    }
    assert policy.violations(PodOptions.from_resource(allowed)) == []
    assert policy.violations(PodOptions.from_resource({"securityContext": {}})) == []
    widened = PodTemplatePolicy.from_lists([*RESTRICTED_VOLUME_TYPES, "hostPath"], ["deployer"])
    assert widened.violations(PodOptions.from_resource(HOSTILE_TEMPLATE)) == [REFUSALS[2]]


def test_the_allowlists_come_from_flags_or_the_environment_and_are_checked() -> None:
    env = {"ARDIFF_REDIS_URL": "redis://redis:6379/0", "ARDIFF_OPERATOR_ALLOWED_SERVICE_ACCOUNTS": "a, b"}
    config = config_from_env(env, namespaces=("worlds",), allowed_volume_types="secret,emptyDir")
    assert config.pod_policy == PodTemplatePolicy(frozenset({"secret", "emptyDir"}), frozenset({"a", "b"}))
    assert (
        config_from_env(env, namespaces=("worlds",), allowed_volume_types="").pod_policy.volume_types == set()
    )
    with pytest.raises(OperatorConfigError, match=r"allowed service accounts must be .*\['Bad_Name'\]"):
        config_from_env(env, namespaces=("worlds",), allowed_service_accounts="Bad_Name")


@pytest.mark.slow
async def test_a_pool_asking_for_a_host_path_root_or_another_account_gets_no_pod(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.create_pool(**HOSTILE_TEMPLATE)  # no admission policy here: the chart's is tested in tests/chart
    progressing = wait_until(
        lambda: (c := cluster.pool_condition("Progressing")).get("reason") == "InvalidPodTemplate" and c,
        what="Progressing=False InvalidPodTemplate",
    )
    assert progressing["status"] == "False"
    assert progressing["message"] == f"the operator does not make this Pod: {'; '.join(REFUSALS)}"
    [event] = wait_until(lambda: cluster.events("InvalidPodTemplate"), what="an InvalidPodTemplate event")
    assert event["message"] == progressing["message"]
    await asyncio.sleep(2)  # several rounds: still nothing made
    assert cluster.pods() == []

    allowed = {"volumes": [{"name": "scratch", "emptyDir": {}}], "serviceAccountName": None}
    cluster.patch_pool_spec({**allowed, "securityContext": {"runAsUser": 1000, "runAsNonRoot": True}})
    [name] = cluster.wait_pods(1)
    pod = cluster.get("pods", name, core=True)
    assert [v["name"] for v in pod["spec"]["volumes"] if "emptyDir" in v and v["name"] == "scratch"]
    assert pod["spec"].get("serviceAccountName", "default") == "default"


@pytest.mark.slow
async def test_a_session_image_reads_only_secrets_labelled_for_sessions(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    picture = bytes(range(256)) * 2

    def secret(name: str, labels: dict[str, str]) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "labels": labels},
            "data": {"picture.png": base64.b64encode(picture).decode()},
        }
        reply = cluster.http.post(f"/api/v1/namespaces/{cluster.namespace}/secrets", json=body)
        assert reply.status_code == 201, reply.text

    secret("credentials", {})
    secret("labelled-wrong", {SESSION_IMAGE_LABEL: "yes"})
    secret("pictures", {SESSION_IMAGE_LABEL: "true"})
    cluster.create_pool()
    for session, source in [
        ("prying", "credentials"),
        ("sloppy", "labelled-wrong"),
        ("pictured", "pictures"),
    ]:
        cluster.create_session(session, image={"secretKeyRef": {"name": source, "key": "picture.png"}})

    cluster.wait_phase("pictured", "Ready")
    record = await store.get_session(PoolId(cluster.namespace, "pool"), "pictured")
    assert record is not None
    assert record.image == picture
    for session, source in [("prying", "credentials"), ("sloppy", "labelled-wrong")]:
        status = cluster.wait_phase(session, "Failed", reason="ImageNotAllowed")
        assert status["message"] == (
            f"secret {source} is not labelled {SESSION_IMAGE_LABEL}=true: a session reads only the Secrets "
            "that opt in"
        )
        assert await store.get_session(PoolId(cluster.namespace, "pool"), session) is None
