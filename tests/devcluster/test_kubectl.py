"""The real kubectl binary against the session's real API server and our CRDs: apply, get (printer columns,
categories, short names), the server's refusals and warnings, wait, delete and the garbage collector's
cascade."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ardiff.devcluster.cluster import DevCluster

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def kubectl(dev_cluster: DevCluster, kube_namespace: str):
    def run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return dev_cluster.kubectl("-n", kube_namespace, *args, stdin=stdin, check=check)

    return run


def table(output: str) -> list[list[str]]:
    return [line.split() for line in output.strip().splitlines()]


def test_apply_crds_then_examples_and_get_printer_columns(kubectl) -> None:
    # The session's cluster serves crds/ already (shared by every test): applied as a server-side dry-run,
    # which the server judges as the update it would be.
    crds = kubectl("apply", "--dry-run=server", "-f", str(REPO / "crds"))
    for name in ("ardiffusionsessions.ardiffusion.dev", "ardiffusionworkerpools.ardiffusion.dev"):
        assert f"customresourcedefinition.apiextensions.k8s.io/{name} " in crds.stdout
        assert "(server dry run)" in crds.stdout
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
        "NAME", "READY", "CAPACITY", "COMPUTE", "SESSIONS", "PENDING", "AGE",
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
    # --validate=warn: the server prunes the field and says so; --validate=false asks it to say nothing.
    warned = kubectl("apply", "--validate=warn", "-f", "-", stdin=unknown)
    assert "bad-one created" in warned.stdout
    assert 'Warning: unknown field "spec.colour"' in warned.stderr  # the apiserver's warning
    assert "colour" not in kubectl("get", "adsession", "bad-one", "-o", "jsonpath={.spec}").stdout
    quiet = kubectl("apply", "--validate=false", "-f", "-", stdin=unknown.replace("bad-one", "bad-two"))
    assert "bad-two created" in quiet.stdout
    assert "unknown field" not in quiet.stderr
    assert "colour" not in kubectl("get", "adsession", "bad-two", "-o", "jsonpath={.spec}").stdout


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
    # The garbage collector deletes the dependent (background propagation), its kubelet confirms.
    kubectl("wait", "--for=delete", "pod/w1", "--timeout=60s")
    assert kubectl("get", "pods", "-o", "name").stdout.split() == ["pod/w2"]
