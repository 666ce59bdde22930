"""`ardiff worker download-model` (the pool's modelDownload step) against a local file server, offline."""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path

import pytest

from ardiff.worker.download import MARKER, DownloadSource, download_model, main
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
