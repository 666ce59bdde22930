"""The front door's Envoy configuration (`ardiff.gateway.envoy_config`, issue 37), checked by Envoy itself
(`envoy --mode validate`), in every shape the chart asks for, and its settings' refusals."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from ardiff.cli import main
from ardiff.devcluster.binaries import ensure_envoy
from ardiff.devcluster.pki import CertificateAuthority
from ardiff.gateway.envoy_config import CDS_FILE, EnvoySettings, render, tls_cluster_name, write_tls_clusters

CA = "/etc/ssl/certs/ca-certificates.crt"  # any PEM bundle Envoy can read


def validate(config: Path) -> str:
    done = subprocess.run(
        [str(ensure_envoy()), "--mode", "validate", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def test_the_plain_bootstrap_is_valid(tmp_path: Path) -> None:
    config = tmp_path / "envoy.yaml"
    config.write_text(render(EnvoySettings()))
    assert "OK" in validate(config)


def test_tls_at_the_edge_and_the_tls_pools_clusters_are_valid(tmp_path: Path) -> None:
    """Downstream TLS from a kubernetes.io/tls Secret's files; the TLS pools' clusters read from the dynamic
    directory (a picker on a DNS name, as a third-party gateway's may be)."""
    ca = CertificateAuthority(tmp_path / "ca")
    edge = ca.issue("edge", common_name="worlds.example.com", server=True, dns_names=["worlds.example.com"])
    dynamic = tmp_path / "dynamic"
    name = tls_cluster_name("tenant-a", "worlds", "ab" * 32)
    write_tls_clusters(dynamic, {name: str(ca.cert_path)})
    clusters = yaml.safe_load((dynamic / CDS_FILE).read_text())["resources"]
    assert [cluster["name"] for cluster in clusters] == [name]
    config = tmp_path / "envoy.yaml"
    settings = EnvoySettings(
        tls_cert_file=str(edge.cert),
        tls_key_file=str(edge.key),
        dynamic_dir=str(dynamic),
        picker="picker.svc:9002",
    )
    config.write_text(render(settings))
    assert "OK" in validate(config)
    # `--mode validate` does not read the dynamic file: the same clusters, static, are checked too.
    static = yaml.safe_load(config.read_text())
    static["static_resources"]["clusters"] += [
        {key: value for key, value in cluster.items() if key != "@type"} for cluster in clusters
    ]
    config.write_text(yaml.safe_dump(static))
    assert "OK" in validate(config)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"listen_port": 0}, "listen_port must be a port"),
        ({"health_port": 70000}, "health_port must be a port"),
        ({"admin_port": 8080}, "must differ"),
        ({"picker": "nowhere"}, "picker must be <host>:<port>"),
        ({"tls_cert_file": CA}, "go together"),
    ],
)
def test_settings_refuse_what_envoy_could_not_run(fields, message) -> None:
    with pytest.raises(ValueError, match=message):
        EnvoySettings(**fields)


def test_the_bootstrap_command_writes_the_file_and_refuses_bad_flags(tmp_path: Path, capsys) -> None:
    out = tmp_path / "etc" / "envoy.yaml"
    assert main(["gateway", "bootstrap", "--out", str(out), "--listen-port", "18080"]) == 0
    listeners = yaml.safe_load(out.read_text())["static_resources"]["listeners"]
    assert listeners[0]["address"]["socket_address"]["port_value"] == 18080
    assert main(["gateway", "bootstrap", "--out", str(out), "--picker", "no-port"]) == 2
    assert "picker must be <host>:<port>" in capsys.readouterr().err
