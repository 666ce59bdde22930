"""`ardiff worker download-model`: the pool's model download step (`spec.modelDownload`, an init container).

It fetches a Hugging Face repo (`huggingface_hub.snapshot_download`) or one http(s) URL (a `.tar`, `.tar.gz`
or `.tgz` is unpacked, any other file is saved under its name) into `--dest`. The download goes to a sibling
directory first and is renamed into place only when complete, with a marker naming its source: on a
PersistentVolumeClaim shared by the pool's Pods a complete download is kept (the step returns at once) and
Pods starting together never see a half-written model (the first to finish wins; the others drop theirs). A
token (`ARDIFF_DOWNLOAD_TOKEN`, from the pool's `tokenSecretRef`) goes to Hugging Face, or as a bearer token
to the URL.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

MARKER = ".ardiff-download.json"
TOKEN_ENV = "ARDIFF_DOWNLOAD_TOKEN"
_ARCHIVES = (".tar", ".tar.gz", ".tgz")


@dataclass(frozen=True)
class DownloadSource:
    """Exactly one of a Hugging Face repo (with an optional revision) and a URL."""

    url: str | None = None
    hf_repo: str | None = None
    revision: str | None = None

    def __post_init__(self) -> None:
        if (self.url is None) == (self.hf_repo is None):
            raise ValueError("model download must name exactly one of --url and --hf-repo")
        if self.url is not None and urllib.parse.urlsplit(self.url).scheme not in ("http", "https"):
            raise ValueError(f"model download url must be http(s), got {self.url!r}")

    def describe(self) -> dict[str, str]:
        if self.url is not None:
            return {"url": self.url}
        return {"huggingFace": str(self.hf_repo), "revision": self.revision or "main"}


def is_complete(dest: Path, source: DownloadSource) -> bool:
    """Whether `dest` holds a finished download of `source` (its marker says so)."""
    try:
        return json.loads((dest / MARKER).read_text()) == source.describe()
    except (OSError, ValueError):
        return False


def download_model(source: DownloadSource, dest: Path, *, token: str | None = None) -> bool:
    """Fetch `source` into `dest`; False when a complete download of it is already there."""
    if is_complete(dest, source):
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        if source.url is not None:
            _fetch_url(source.url, staging, token)
        else:
            _fetch_hugging_face(source, staging, token)
        (staging / MARKER).write_text(json.dumps(source.describe()))
        if dest.exists():
            if is_complete(dest, source):  # another Pod finished first
                return False
            shutil.rmtree(dest)  # an older or different download: replaced
        try:
            staging.rename(dest)
        except OSError:
            if is_complete(dest, source):  # another Pod renamed its copy in between
                return False
            raise
        return True
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _fetch_url(url: str, staging: Path, token: str | None) -> None:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    name = Path(urllib.parse.urlsplit(url).path).name or "model"
    with urllib.request.urlopen(request, timeout=60) as response:  # http(s) only: checked above
        if name.endswith(_ARCHIVES):
            with tarfile.open(fileobj=response, mode="r|*") as archive:
                archive.extractall(staging, filter="data")  # no absolute paths, links out or devices
        else:
            with (staging / name).open("wb") as out:
                shutil.copyfileobj(response, out, length=1 << 20)


def _fetch_hugging_face(source: DownloadSource, staging: Path, token: str | None) -> None:
    from huggingface_hub import snapshot_download  # the worker image has it; the operator's does not need it

    snapshot_download(
        repo_id=str(source.hf_repo), revision=source.revision, local_dir=str(staging), token=token or None
    )


def main(url: str | None, hf_repo: str | None, revision: str | None, dest: str) -> str:
    """The command's body: a line saying what it did."""
    source = DownloadSource(url=url, hf_repo=hf_repo, revision=revision)
    fetched = download_model(source, Path(dest), token=os.environ.get(TOKEN_ENV) or None)
    what = source.url or f"{source.hf_repo}@{source.revision or 'main'}"
    return f"downloaded {what} to {dest}" if fetched else f"{dest} already holds {what}"
