"""The real kubectl binary against the emulated API: apply, get (printer columns), wait, delete, cascade."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ardiff.devcluster.kube_api import KubeAPIThread
from ardiff.devcluster.kubectl import run_kubectl

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def kubectl(kube_api: KubeAPIThread, kube_namespace: str):
    assert kube_api.kubeconfig is not None

    def run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_kubectl(
            ["-n", kube_namespace, *args], kubeconfig=kube_api.kubeconfig, stdin=stdin, check=check
        )

    return run


def table(output: str) -> list[list[str]]:
    return [line.split() for line in output.strip().splitlines()]


def test_apply_crds_then_examples_and_get_printer_columns(kubectl) -> None:
    crds = kubectl("apply", "-f", str(REPO / "crds"))
    assert "customresourcedefinition.apiextensions.k8s.io/ardiffusionsessions.ardiffusion.dev" in crds.stdout
    applied = kubectl("apply", "-f", str(REPO / "examples"))
    for name in ("tiny-world", "forest-walk", "desert-drive", "harbor-flight"):
        assert f"/{name} created" in applied.stdout
    kubectl("patch", "adsession", "forest-walk", "--subresource=status", "--type=merge",
            "-p", '{"status": {"phase": "Ready", "pod": "tiny-world-x7k2p", "chunkIndex": 4}}')  # fmt: skip
    rows = table(kubectl("get", "adsession").stdout)
    assert rows[0] == ["NAME", "PHASE", "POOL", "POD", "CHUNK", "AGE"]
    assert rows[1][0] == "desert-drive"
    by_name = {row[0]: row for row in rows[1:]}
    assert by_name["forest-walk"][1:5] == ["Ready", "tiny-world", "tiny-world-x7k2p", "4"]
    assert table(kubectl("get", "adpool", "-o", "wide").stdout)[0] == [
        "NAME", "READY", "CAPACITY", "SESSIONS", "PENDING", "AGE",
    ]  # fmt: skip
    # Categories and short names work as on a real cluster.
    names = kubectl("get", "ardiff", "-o", "name").stdout.split()
    assert "ardiffusionsession.ardiffusion.dev/forest-walk" in names
    assert "ardiffusionworkerpool.ardiffusion.dev/tiny-world" in names
    # Re-applying what did not change is a no-op.
    assert "unchanged" in kubectl("apply", "-f", str(REPO / "examples" / "sessions.yaml")).stdout


BAD_SESSION = """
apiVersion: ardiffusion.dev/v1alpha1
kind: ARDiffusionSession
metadata:
  name: bad-one
spec:
  poolRef: tiny-world
  prompt: x
  evictionPolicy: Sometimes
  priority: 2000
"""


def test_bad_custom_resources_are_refused_naming_the_fields(kubectl) -> None:
    refused = kubectl("apply", "-f", "-", stdin=BAD_SESSION, check=False)
    assert refused.returncode == 1
    assert 'The ARDiffusionSession "bad-one" is invalid' in refused.stderr
    assert 'spec.evictionPolicy: Unsupported value: "Sometimes"' in refused.stderr
    assert "spec.priority: Invalid value: 2000" in refused.stderr
    unknown = BAD_SESSION.replace("evictionPolicy: Sometimes", "colour: blue").replace("2000", "1")
    strict = kubectl("apply", "-f", "-", stdin=unknown, check=False)
    assert strict.returncode == 1
    assert 'strict decoding error: unknown field "spec.colour"' in strict.stderr
    lenient = kubectl("apply", "--validate=false", "-f", "-", stdin=unknown)
    assert "bad-one created" in lenient.stdout
    assert 'unknown field "spec.colour"' in lenient.stderr  # the apiserver's warning
    assert "colour" not in kubectl("get", "adsession", "bad-one", "-o", "jsonpath={.spec}").stdout


OWNED = """
apiVersion: v1
kind: Pod
metadata:
  name: {pod}
  labels: {{app.kubernetes.io/component: idle}}
  ownerReferences:
    - {{apiVersion: ardiffusion.dev/v1alpha1, kind: ARDiffusionSession, name: s1, uid: "{uid}"}}
spec:
  containers: [{{name: c, image: x}}]
"""


def test_delete_cascades_to_owned_objects_and_selectors_work(kubectl) -> None:
    kubectl("apply", "-f", "-", stdin="apiVersion: ardiffusion.dev/v1alpha1\nkind: ARDiffusionSession\n"
            "metadata: {name: s1}\nspec: {poolRef: p, prompt: x}\n")  # fmt: skip
    uid = kubectl("get", "adsession", "s1", "-o", "jsonpath={.metadata.uid}").stdout
    kubectl("apply", "-f", "-", stdin=OWNED.format(pod="w1", uid=uid))
    kubectl("run", "w2", "--image=x", "--labels=app.kubernetes.io/component=worker")
    assert kubectl(
        "get", "pods", "-l", "app.kubernetes.io/component=worker", "-o", "name"
    ).stdout.split() == ["pod/w2"]
    kubectl("wait", "--for=jsonpath={.status.phase}=Pending", "pod/w1", "--timeout=10s")
    deleted = kubectl("delete", "adsession", "s1", "--timeout=20s")
    assert 'ardiffusionsession.ardiffusion.dev "s1" deleted' in deleted.stdout
    assert kubectl("get", "pods", "-o", "name").stdout.split() == ["pod/w2"]


BUILTINS = """
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {a: "1", b: "2"}
binaryData: {c: AA==}
---
apiVersion: v1
kind: Secret
metadata: {name: token}
stringData: {token: t}
---
apiVersion: v1
kind: Service
metadata: {name: workers}
spec:
  clusterIP: None
  selector: {app: w}
  ports: [{name: http, port: 8000, targetPort: http}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: workers}
spec: {maxUnavailable: 1, selector: {matchLabels: {app: w}}}
---
apiVersion: v1
kind: Pod
metadata: {name: w1, labels: {app: w}}
spec:
  containers: [{name: worker, image: img}]
---
apiVersion: v1
kind: Event
metadata: {name: w1.1}
involvedObject: {kind: Pod, name: w1}
type: Warning
reason: BackOff
message: "  Back-off restarting failed container  "
firstTimestamp: "2020-01-01T00:00:00Z"
lastTimestamp: "2020-01-01T00:00:00Z"
count: 3
source: {component: kubelet, host: node-1}
"""


def test_get_shows_the_apiservers_columns_for_built_in_kinds(kubectl, kube_namespace: str) -> None:
    kubectl(
        "apply",
        "-f",
        "-",
        stdin=BUILTINS.replace("involvedObject: {", f"involvedObject: {{namespace: {kube_namespace}, "),
    )
    events = table(kubectl("get", "events").stdout)
    assert events[0] == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert events[1][1:] == ["Warning", "BackOff", "pod/w1", "Back-off", "restarting", "failed", "container"]
    wide_output = kubectl("get", "events", "-o", "wide").stdout
    wide = table(wide_output)
    assert wide[0][-7:] == ["SUBOBJECT", "SOURCE", "MESSAGE", "FIRST", "SEEN", "COUNT", "NAME"]
    assert wide[1][-2:] == ["3", "w1.1"]
    assert "kubelet, node-1" in wide_output
    pods = table(kubectl("get", "pods").stdout)
    assert pods[0] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert pods[1][:4] == ["w1", "0/1", "Pending", "0"]
    services = table(kubectl("get", "services", "-o", "wide").stdout)
    assert services[0] == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE", "SELECTOR"]
    assert services[1][:5] + services[1][6:] == [
        "workers",
        "ClusterIP",
        "None",
        "<none>",
        "8000/TCP",
        "app=w",
    ]
    secrets = table(kubectl("get", "secrets").stdout)
    assert secrets[0] == ["NAME", "TYPE", "DATA", "AGE"]
    assert secrets[1][:3] == ["token", "Opaque", "1"]
    config_maps = table(kubectl("get", "configmaps").stdout)
    assert (config_maps[0], config_maps[1][:2]) == (["NAME", "DATA", "AGE"], ["settings", "3"])
    pdbs = table(kubectl("get", "pdb").stdout)
    assert pdbs[0] == ["NAME", "MIN", "AVAILABLE", "MAX", "UNAVAILABLE", "ALLOWED", "DISRUPTIONS", "AGE"]
    assert pdbs[1][:4] == ["workers", "N/A", "1", "0"]
