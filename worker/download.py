"""`ardiff worker download-model`: the pool's model download step (`spec.modelDownload`, an init container).

It fetches a Hugging Face repo (`huggingface_hub.snapshot_download`) or one http(s) URL (a `.tar`, `.tar.gz`
or `.tgz` is unpacked, any other file is saved under its name) into `--dest`. The download goes to a sibling
directory first and is renamed into place only when complete, with a marker naming its source: on a
PersistentVolumeClaim shared by the pool's Pods a complete download is kept (the step returns at once) and
Pods starting together never see a half-written model (the first to finish wins; the others drop theirs). A
token (`ARDIFF_DOWNLOAD_TOKEN`, from the pool's `tokenSecretRef`) goes to Hugging Face, or as a bearer token
to the URL.

A URL download trusts its server no further than it must (issue 23 item 10): a redirect is followed with the
token only to the origin the token was given for, never from https to anything else; it takes at most
`max_bytes` over the wire and, unpacked, on disk; with a `sha256` the bytes fetched must have that digest.
Whatever fails, nothing of it reaches `--dest`.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import tarfile
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ardiff.errors import ArdiffError

MARKER = ".ardiff-download.json"
TOKEN_ENV = "ARDIFF_DOWNLOAD_TOKEN"
_ARCHIVES = (".tar", ".tar.gz", ".tgz")
# What a URL download may take by default, fetched and unpacked alike: far above any model the pools serve
# (tens of GB), so that only a broken or hostile server (an endless body, an archive bomb) meets it.
MAX_DOWNLOAD_BYTES = 256 << 30
_CHUNK_BYTES = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DEFAULT_PORTS = {"http": 80, "https": 443}


class DownloadRefused(ArdiffError):
    """The server's answer is not what this download may accept (a redirect, its size, its digest)."""

    code = "download_refused"


@dataclass(frozen=True)
class DownloadSource:
    """Exactly one of a Hugging Face repo (with an optional revision) and a URL (with an optional SHA-256 of
    the bytes it serves: a repo's revision pins its content instead)."""

    url: str | None = None
    hf_repo: str | None = None
    revision: str | None = None
    sha256: str | None = None

    def __post_init__(self) -> None:
        if (self.url is None) == (self.hf_repo is None):
            raise ValueError("model download must name exactly one of --url and --hf-repo")
        if self.url is not None and urllib.parse.urlsplit(self.url).scheme not in ("http", "https"):
            raise ValueError(f"model download url must be http(s), got {self.url!r}")
        if self.sha256 is not None and (self.url is None or not _SHA256.fullmatch(self.sha256)):
            raise ValueError("model download --sha256 is 64 lowercase hex digits, and only with --url")

    def describe(self) -> dict[str, str]:
        """What the marker records: a download of another source, or of another digest, is not this one."""
        if self.url is not None:
            return {"url": self.url} if self.sha256 is None else {"url": self.url, "sha256": self.sha256}
        return {"huggingFace": str(self.hf_repo), "revision": self.revision or "main"}


def is_complete(dest: Path, source: DownloadSource) -> bool:
    """Whether `dest` holds a finished download of `source` (its marker says so)."""
    try:
        return json.loads((dest / MARKER).read_text()) == source.describe()
    except (OSError, ValueError):
        return False


def download_model(
    source: DownloadSource, dest: Path, *, token: str | None = None, max_bytes: int = MAX_DOWNLOAD_BYTES
) -> bool:
    """Fetch `source` into `dest`; False when a complete download of it is already there."""
    if is_complete(dest, source):
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        if source.url is not None:
            _fetch_url(source.url, staging, token, max_bytes=max_bytes, sha256=source.sha256)
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


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or _DEFAULT_PORTS.get(parts.scheme)


class _GuardedRedirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, which forward every header but the body's to wherever a redirect points (another
    host, or plain http from https: the token in the clear), made safe: from https only to https (anything
    else is refused), and the token only to the origin it was given for (the download goes on without it)."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        scheme = urllib.parse.urlsplit(newurl).scheme
        downgrade = urllib.parse.urlsplit(req.full_url).scheme == "https" and scheme != "https"
        if scheme not in ("http", "https") or downgrade:
            raise DownloadRefused(f"refused a redirect from {req.full_url} to {newurl}: not https")
        redirected = super().redirect_request(req, fp, code, msg, headers, newurl)
        if redirected is not None and _origin(newurl) != _origin(req.full_url):
            redirected.remove_header("Authorization")
        return redirected


class _CheckedBody:
    """A response body read through a count (at most `max_bytes`) and a SHA-256 of every byte read."""

    def __init__(self, response: IO[bytes], max_bytes: int) -> None:
        self._response = response
        self._max_bytes = max_bytes
        self.received = 0
        self.digest = hashlib.sha256()

    def read(self, size: int) -> bytes:
        data = self._response.read(size)
        self.received += len(data)
        if self.received > self._max_bytes:
            raise DownloadRefused(f"the download is over its limit of {self._max_bytes} bytes")
        self.digest.update(data)
        return data

    def drain(self) -> None:
        """Read what is left (a tar's padding after its last member): the digest covers the whole body."""
        while self.read(_CHUNK_BYTES):
            pass


def _fetch_url(url: str, staging: Path, token: str | None, *, max_bytes: int, sha256: str | None) -> None:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    name = Path(urllib.parse.urlsplit(url).path).name or "model"
    opener = urllib.request.build_opener(_GuardedRedirects)
    with opener.open(request, timeout=60) as response:  # http(s) only: checked above and at each redirect
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise DownloadRefused(f"the download declares {declared} bytes, over its limit of {max_bytes}")
        body = _CheckedBody(response, max_bytes)
        if name.endswith(_ARCHIVES):
            unpacked = 0

            def bounded(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
                nonlocal unpacked
                checked = tarfile.data_filter(member, path)  # no absolute paths, links out or devices
                unpacked += checked.size
                if unpacked > max_bytes:  # a small archive can unpack to any size
                    raise DownloadRefused(f"the archive unpacks to over its limit of {max_bytes} bytes")
                return checked

            with tarfile.open(fileobj=body, mode="r|*") as archive:
                archive.extractall(staging, filter=bounded)
            body.drain()
        else:
            with (staging / name).open("wb") as out:
                shutil.copyfileobj(body, out, length=_CHUNK_BYTES)
    if sha256 is not None and body.digest.hexdigest() != sha256:
        raise DownloadRefused(
            f"the download's SHA-256 is {body.digest.hexdigest()}, not the {sha256} expected"
        )


def _fetch_hugging_face(source: DownloadSource, staging: Path, token: str | None) -> None:
    from huggingface_hub import snapshot_download  # the worker image has it; the operator's does not need it

    snapshot_download(
        repo_id=str(source.hf_repo), revision=source.revision, local_dir=str(staging), token=token or None
    )


def main(
    url: str | None,
    hf_repo: str | None,
    revision: str | None,
    dest: str,
    *,
    sha256: str | None = None,
    max_bytes: int = MAX_DOWNLOAD_BYTES,
) -> str:
    """The command's body: a line saying what it did."""
    source = DownloadSource(url=url, hf_repo=hf_repo, revision=revision, sha256=sha256)
    fetched = download_model(source, Path(dest), token=os.environ.get(TOKEN_ENV) or None, max_bytes=max_bytes)
    what = source.url or f"{source.hf_repo}@{source.revision or 'main'}"
    return f"downloaded {what} to {dest}" if fetched else f"{dest} already holds {what}"
