"""What a pool may make the operator put in a worker Pod (issue 23 item 7; docs/contracts.md §10).

The operator is nobody's deputy: a user who may create an ARDiffusionWorkerPool but not Pods must not get,
through the operator's service account, a Pod they could not make themselves. A pool's Pod template may carry
only volume types of an allowlist (default: those of the Pod Security Standards' `restricted` profile, so no
`hostPath`), a ServiceAccount only from an allowlist (unset: the namespace's `default`), and no
`runAsUser: 0`. Privilege escalation and host namespaces are not in the pool's schema at all: the worker
container's securityContext is the operator's (`ardiff.operator.pods.CONTAINER_SECURITY_CONTEXT`).

The chart's ValidatingAdmissionPolicy (`charts/ardiff/templates/worker-pod-policy.yaml`) refuses such a pool
at admission, from the same allowlists (the CRD cannot: its schema is not templated, and the CEL of a CRD
cannot see a volume's preserved-unknown source). The operator checks again before it creates a Pod (a pool
admitted before the policy was installed, or a cluster without it): a refusal is the pool's
`Progressing=False InvalidPodTemplate` condition and a Warning Event, and no Pod is made.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ardiff.operator.specs import PodOptions

# The Pod Security Standards' `restricted` profile's volume types.
RESTRICTED_VOLUME_TYPES = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
)
# A Pod without serviceAccountName runs as its namespace's `default`: always allowed.
DEFAULT_SERVICE_ACCOUNT = "default"
_VOLUME_TYPE = re.compile(r"^[a-z][A-Za-z0-9]*$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class PodTemplatePolicy:
    """The allowlists a pool's Pod template is checked against (the operator's `--allowed-volume-types`
    and `--allowed-service-accounts`; the chart's `workerPods.allowedVolumeTypes` and
    `workerPods.allowedServiceAccounts`)."""

    volume_types: frozenset[str] = frozenset(RESTRICTED_VOLUME_TYPES)
    service_accounts: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        bad_types = sorted(t for t in self.volume_types if not _VOLUME_TYPE.match(t))
        if bad_types:
            raise ValueError(f"allowed volume types must be volume source fields, got {bad_types}")
        bad_names = sorted(n for n in self.service_accounts if not _NAME.match(n))
        if bad_names:
            raise ValueError(f"allowed service accounts must be ServiceAccount names, got {bad_names}")

    @classmethod
    def from_lists(cls, volume_types: Iterable[str], service_accounts: Iterable[str]) -> PodTemplatePolicy:
        return cls(frozenset(volume_types), frozenset(service_accounts))

    def violations(self, options: PodOptions) -> list[str]:
        """What of the template the policy refuses, each naming its field; empty when it is allowed."""
        found = []
        for index, volume in enumerate(options.volumes):
            for source in sorted(set(volume) - {"name"} - self.volume_types):
                found.append(
                    f"spec.volumes[{index}] ({volume.get('name')}): volume type {source} is not allowed "
                    f"(allowed: {', '.join(sorted(self.volume_types)) or 'none'})"
                )
        account = options.service_account_name
        if account not in (None, DEFAULT_SERVICE_ACCOUNT) and account not in self.service_accounts:
            allowed = ", ".join(sorted({DEFAULT_SERVICE_ACCOUNT, *self.service_accounts}))
            found.append(f"spec.serviceAccountName {account} is not allowed (allowed: {allowed})")
        if (options.security_context or {}).get("runAsUser") == 0:
            found.append("spec.securityContext.runAsUser 0 (root) is not allowed")
        return found
