"""`KubeSessions.fork` and `create(keep_chunks=)` on the real API server with crds/ installed (no operator:
the resources as stored are the subject): a fork names its parent and chunk in `spec.forkFrom`, is in the
parent's pool and family, and leaves out what it inherits; the API's refusals are typed; `ardiff session
fork` says them in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ardiff.client import InvalidSession, KubeSessions, SessionNotFound
from ardiff.devcluster.cluster import DevCluster


@pytest.fixture
def sessions(dev_cluster: DevCluster, kube_namespace: str) -> KubeSessions:
    return KubeSessions(kube_namespace, kubeconfig=dev_cluster.kubeconfig)


def test_a_fork_names_its_parent_and_chunk_and_inherits_the_rest(sessions: KubeSessions) -> None:
    parent = sessions.create("walk", pool="tiny-world", prompt="a misty forest", seed=7, keep_chunks=4)
    assert parent["spec"]["history"] == {"keepChunks": 4}
    sessions.fork("walk", "walk-b", at=3)
    sessions.fork("walk", "walk-c", prompt="a sunny forest", keep_chunks=2)
    child, other = sessions.get("walk-b")["spec"], sessions.get("walk-c")["spec"]
    assert child["forkFrom"] == {"session": "walk", "chunk": 3}
    assert (child["poolRef"], child["family"]) == ("tiny-world", parent["spec"]["family"])
    assert "prompt" not in child  # the parent's, resolved by the operator
    assert "seed" not in child
    assert "history" not in child  # a child keeps none of its own unless asked
    assert other["forkFrom"] == {"session": "walk"}  # no chunk: the parent's latest kept one
    assert (other["prompt"], other["history"]) == ("a sunny forest", {"keepChunks": 2})
    assert sessions.get("walk")["spec"] == parent["spec"]  # the parent is left as it is


def test_a_fork_of_an_unknown_parent_or_at_chunk_0_is_refused(sessions: KubeSessions) -> None:
    with pytest.raises(SessionNotFound, match="get session nobody"):
        sessions.fork("nobody", "nobody-b", at=2)
    sessions.create("walk", pool="tiny-world", prompt="a misty forest", keep_chunks=4)
    with pytest.raises(InvalidSession, match=r"forkFrom\.chunk") as refused:
        sessions.fork("walk", "walk-b", at=0)
    assert refused.value.status == 422
    with pytest.raises(SessionNotFound):
        sessions.get("walk-b")


def test_the_cli_says_an_unknown_parent_in_one_line(dev_cluster: DevCluster, kube_namespace: str) -> None:
    command = [sys.executable, "-m", "ardiff.cli", "session", "fork", "nobody", "nobody-b", "--at", "2"]
    command += ["-n", kube_namespace, "--kubeconfig", str(dev_cluster.kubeconfig)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert result.stderr.startswith("error: session_not_found: get session nobody:"), result.stderr
    assert "Traceback" not in result.stderr
