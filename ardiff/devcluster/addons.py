"""The cluster's add-ons, as kubeadm installs them: kube-proxy (a DaemonSet of host-network Pods, one per
node) and CoreDNS (a Deployment behind the `kube-dns` Service at the tenth address of the Service range).

Pure builders: each returns the objects to apply. kube-proxy reaches the API server at its own address (its
kubeconfig in a ConfigMap, with its service-account token), since the `kubernetes` Service it would otherwise
use is what kube-proxy itself makes reachable; it runs in iptables mode with the cluster CIDR set, so traffic
from outside the Pods' CIDR to a ClusterIP is masqueraded (the root namespace reaches Services through node
1). CoreDNS serves `cluster.local` from the Kubernetes API and nothing else (no upstream resolver is
reachable); it binds port 53 as a non-root user through the safe sysctl `net.ipv4.ip_unprivileged_port_start`.
"""

from __future__ import annotations

from typing import Any

import yaml

from ardiff.devcluster.binaries import COREDNS_MODULE, KUBERNETES_VERSION, module_version
from ardiff.devcluster.images import COREDNS_IMAGE, KUBE_PROXY_IMAGE
from ardiff.devcluster.network import ClusterNetwork

SYSTEM = "kube-system"
CRITICAL_TOLERATIONS = [{"operator": "Exists"}]


def _meta(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": name, "namespace": SYSTEM, **({"labels": labels} if labels else {})}


def kube_proxy(network: ClusterNetwork, server: str) -> list[dict[str, Any]]:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clusterCIDR": str(network.cluster_cidr),
        "clientConnection": {"kubeconfig": "/var/lib/kube-proxy/kubeconfig.conf"},
        # Leave the kernel's conntrack table and timeouts alone (not every namespace may set them).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "metricsBindAddress": "127.0.0.1:10249",
    }
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "default",
                "cluster": {
                    "server": server,
                    "certificate-authority": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                },
            }
        ],
        "users": [
            {"name": "default", "user": {"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}}
        ],
        "contexts": [
            {"name": "default", "context": {"cluster": "default", "namespace": "default", "user": "default"}}
        ],
        "current-context": "default",
    }
    labels = {"k8s-app": "kube-proxy"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta("kube-proxy")},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "kubeadm:node-proxier"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:node-proxier",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "kube-proxy", "namespace": SYSTEM}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta("kube-proxy", labels),
            "data": {"config.conf": yaml.safe_dump(config), "kubeconfig.conf": yaml.safe_dump(kubeconfig)},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": _meta("kube-proxy", labels),
            "spec": {
                "selector": {"matchLabels": labels},
                "updateStrategy": {"type": "RollingUpdate"},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "hostNetwork": True,
                        "priorityClassName": "system-node-critical",
                        "serviceAccountName": "kube-proxy",
                        "tolerations": CRITICAL_TOLERATIONS,
                        "nodeSelector": {"kubernetes.io/os": "linux", "ardiff.dev/process-node": "true"},
                        "containers": [
                            {
                                "name": "kube-proxy",
                                "image": f"{KUBE_PROXY_IMAGE}:{KUBERNETES_VERSION}",
                                "command": [
                                    "/usr/local/bin/kube-proxy",
                                    "--config=/var/lib/kube-proxy/config.conf",
                                    "--hostname-override=$(NODE_NAME)",
                                ],
                                "env": [
                                    {
                                        "name": "NODE_NAME",
                                        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                                    }
                                ],
                                "securityContext": {"privileged": True},
                                "volumeMounts": [{"name": "kube-proxy", "mountPath": "/var/lib/kube-proxy"}],
                            }
                        ],
                        "volumes": [{"name": "kube-proxy", "configMap": {"name": "kube-proxy"}}],
                    },
                },
            },
        },
    ]


COREFILE = """\
.:53 {
    errors
    health {
        lameduck 2s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    cache 30
    loadbalance
}
"""


def coredns(network: ClusterNetwork) -> list[dict[str, Any]]:
    labels = {"k8s-app": "kube-dns"}
    version = module_version("github.com/coredns/coredns", COREDNS_MODULE)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta("coredns")},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": SYSTEM}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta("coredns"),
            "data": {"Corefile": COREFILE},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta("coredns", labels),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "priorityClassName": "system-cluster-critical",
                        "serviceAccountName": "coredns",
                        "tolerations": CRITICAL_TOLERATIONS,
                        "dnsPolicy": "Default",
                        "nodeSelector": {"ardiff.dev/process-node": "true"},
                        "securityContext": {
                            "runAsNonRoot": True,
                            "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "53"}],
                        },
                        "containers": [
                            {
                                "name": "coredns",
                                "image": f"{COREDNS_IMAGE}:{version}",
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                                ],
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                "livenessProbe": {
                                    "httpGet": {"path": "/health", "port": 8080},
                                    "periodSeconds": 10,
                                },
                                "readinessProbe": {
                                    "httpGet": {"path": "/ready", "port": 8181},
                                    "periodSeconds": 2,
                                },
                                "volumeMounts": [
                                    {"name": "config", "mountPath": "/etc/coredns", "readOnly": True}
                                ],
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta("kube-dns", {**labels, "kubernetes.io/name": "CoreDNS"}),
            "spec": {
                "selector": labels,
                "clusterIP": network.dns_ip,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                ],
            },
        },
    ]
