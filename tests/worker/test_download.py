"""`ardiff worker download-model` (the pool's modelDownload step) against a local file server, offline."""

from __future__ import annotations

import hashlib
import json
import urllib.error
from pathlib import Path

import pytest

from ardiff import cli
from ardiff.devcluster.pki import CertificateAuthority
from ardiff.worker.download import MARKER, DownloadRefused, DownloadSource, download_model, main
from tests.file_server import serve_files, tar_gz

MODEL = {"model/config.json": b'{"tiny": true}', "model/weights.safetensors": b"\x00" * 64}


def test_an_archive_is_unpacked_with_the_token_and_kept_once_complete(tmp_path: Path) -> None:
    with serve_files({"/lingbot.tgz": tar_gz(MODEL)}, token="s3cret") as server:
        source = DownloadSource(url=f"{server.url}/lingbot.tgz")
        dest = tmp_path / "models" / "lingbot"
        assert download_model(source, dest, token="s3cret") is True
        assert (dest / "model" / "config.json").read_bytes() == b'{"tiny": true}'
        assert json.loads((dest / MARKER).read_text()) == {"url": f"{server.url}/lingbot.tgz"}
        # Complete already (a PVC shared by the pool's Pods): nothing is fetched again.
        assert download_model(source, dest, token="s3cret") is False
        assert server.authorizations == ["Bearer s3cret"]
        # Without the token the server refuses, and nothing half-written is left behind.
        with pytest.raises(urllib.error.HTTPError, match="401"):
            download_model(DownloadSource(url=f"{server.url}/lingbot.tgz"), tmp_path / "other")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]
        assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["lingbot"]


def test_a_plain_file_is_saved_under_its_name_and_another_source_replaces_a_download(tmp_path: Path) -> None:
    with serve_files({"/a.safetensors": b"A", "/b.tgz": tar_gz({"b.bin": b"B"})}) as server:
        dest = tmp_path / "m"
        assert "downloaded" in main(f"{server.url}/a.safetensors", None, None, str(dest))
        assert (dest / "a.safetensors").read_bytes() == b"A"
        assert main(f"{server.url}/a.safetensors", None, None, str(dest)).endswith(
            "already holds " + f"{server.url}/a.safetensors"
        )
        assert download_model(DownloadSource(url=f"{server.url}/b.tgz"), dest) is True
        assert sorted(p.name for p in dest.iterdir()) == [MARKER, "b.bin"]


def test_an_archive_cannot_write_outside_its_directory(tmp_path: Path) -> None:
    with (
        serve_files({"/evil.tar.gz": tar_gz({"../escape": b"x"})}) as server,
        pytest.raises(Exception, match="outside the destination"),
    ):
        download_model(DownloadSource(url=f"{server.url}/evil.tar.gz"), tmp_path / "m")
    assert not (tmp_path / "escape").exists()
    assert list(tmp_path.iterdir()) == []


def test_a_source_is_exactly_one_of_url_and_repo() -> None:
    with pytest.raises(ValueError, match="exactly one of --url and --hf-repo"):
        DownloadSource()
    with pytest.raises(ValueError, match="must be http"):
        DownloadSource(url="file:///etc/passwd")
    assert DownloadSource(hf_repo="a/b").describe() == {"huggingFace": "a/b", "revision": "main"}


# -------------------------------------------------------------------------- what a server may not make it do


def test_a_redirect_keeps_the_token_only_within_its_origin(tmp_path: Path) -> None:
    """urllib forwarded the token to wherever a redirect pointed: here, another port of the same host."""
    with (
        serve_files({"/lingbot.tgz": tar_gz(MODEL)}) as elsewhere,
        serve_files(
            {"/lingbot.tgz": tar_gz(MODEL)},
            token="s3cret",
            redirects={"/old.tgz": "/lingbot.tgz", "/cdn.tgz": f"{elsewhere.url}/lingbot.tgz"},
        ) as origin,
    ):
        # Within its origin: the token goes along (the target answers 401 without it).
        assert download_model(DownloadSource(url=f"{origin.url}/old.tgz"), tmp_path / "a", token="s3cret")
        assert origin.authorizations == ["Bearer s3cret"] * 2
        # To another origin: the download goes on without it.
        assert download_model(DownloadSource(url=f"{origin.url}/cdn.tgz"), tmp_path / "b", token="s3cret")
        assert (tmp_path / "b" / "model" / "config.json").read_bytes() == b'{"tiny": true}'
        assert elsewhere.authorizations == [None]


def test_a_redirect_from_https_to_http_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = CertificateAuthority(tmp_path / "ca")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.cert_path))  # what the default https context trusts
    tls = ca.issue("server", common_name="127.0.0.1", server=True, ip_addresses=["127.0.0.1"])
    with (
        serve_files({"/lingbot.tgz": tar_gz(MODEL)}) as plain,
        serve_files(
            {"/lingbot.tgz": tar_gz(MODEL)},
            token="s3cret",
            redirects={"/down.tgz": f"{plain.url}/lingbot.tgz"},
            tls=tls,
        ) as secure,
    ):
        assert download_model(DownloadSource(url=f"{secure.url}/lingbot.tgz"), tmp_path / "m", token="s3cret")
        with pytest.raises(DownloadRefused, match="not https"):
            download_model(DownloadSource(url=f"{secure.url}/down.tgz"), tmp_path / "n", token="s3cret")
        assert plain.authorizations == []  # never asked: not even without the token
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca", "m"]


@pytest.mark.parametrize("declared", [True, False])
def test_a_download_over_its_limit_is_refused(tmp_path: Path, declared: bool) -> None:
    files = {"/a.safetensors": b"A" * 1000, "/b.tgz": tar_gz({"zeros.bin": b"\x00" * 1_000_000})}
    with serve_files(files, declare_length=declared) as server:
        assert download_model(
            DownloadSource(url=f"{server.url}/a.safetensors"), tmp_path / "a", max_bytes=1000
        )
        with pytest.raises(
            DownloadRefused, match="declares 1000 bytes" if declared else "over its limit of 999"
        ):
            download_model(DownloadSource(url=f"{server.url}/a.safetensors"), tmp_path / "b", max_bytes=999)
        # A small archive (about 1 KB, gzip) that unpacks to 1 MB.
        assert len(files["/b.tgz"]) < 10_000
        with pytest.raises(DownloadRefused, match="unpacks to over its limit of 100000 bytes"):
            download_model(DownloadSource(url=f"{server.url}/b.tgz"), tmp_path / "c", max_bytes=100_000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_an_optional_sha256_is_checked_before_the_download_lands(tmp_path: Path) -> None:
    archive = tar_gz(MODEL)
    digest = hashlib.sha256(archive).hexdigest()
    with serve_files({"/lingbot.tgz": archive, "/a.bin": b"A"}) as server:
        url = f"{server.url}/lingbot.tgz"
        with pytest.raises(DownloadRefused, match=f"SHA-256 is {digest}, not the {'0' * 64} expected"):
            download_model(DownloadSource(url=url, sha256="0" * 64), tmp_path / "m")
        assert list(tmp_path.iterdir()) == []  # unpacked, then dropped: nothing reached the destination
        assert download_model(DownloadSource(url=url, sha256=digest), tmp_path / "m") is True
        assert json.loads((tmp_path / "m" / MARKER).read_text()) == {"url": url, "sha256": digest}
        # A download checked against no digest, or another, is not this one: fetched again.
        assert download_model(DownloadSource(url=url), tmp_path / "m") is True
        plain = hashlib.sha256(b"A").hexdigest()
        assert "downloaded" in main(f"{server.url}/a.bin", None, None, str(tmp_path / "a"), sha256=plain)
    with pytest.raises(ValueError, match="only with --url"):
        DownloadSource(hf_repo="a/b", sha256=digest)
    with pytest.raises(ValueError, match="64 lowercase hex"):
        DownloadSource(url="https://example.com/m.tgz", sha256=digest.upper())


def test_the_command_takes_a_digest_and_a_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    digest = hashlib.sha256(b"A" * 10).hexdigest()
    with serve_files({"/a.bin": b"A" * 10}) as server:
        url = f"{server.url}/a.bin"

        def command(*flags: str, dest: str) -> int:
            return cli.main(
                ["worker", "download-model", "--url", url, "--dest", str(tmp_path / dest), *flags]
            )

        assert command("--sha256", "0" * 64, dest="wrong") == 1
        assert "error: download_refused: the download's SHA-256 is" in capsys.readouterr().err
        assert command("--max-bytes", "9", dest="big") == 1
        assert "error: download_refused: the download declares 10 bytes" in capsys.readouterr().err
        assert command("--sha256", "XYZ", dest="bad") == 1
        assert "error: invalid_download: model download --sha256 is 64" in capsys.readouterr().err
        assert command("--sha256", digest, "--max-bytes", "10", dest="m") == 0
    assert (tmp_path / "m" / "a.bin").read_bytes() == b"A" * 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
