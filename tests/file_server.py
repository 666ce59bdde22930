"""A local HTTP file server for offline download tests: serves `files` (path -> bytes), records each request's
Authorization header, and answers 401 to requests without `token` when one is set."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class FileServer:
    url: str
    files: dict[str, bytes]
    token: str | None = None
    authorizations: list[str | None] = field(default_factory=list)


@contextmanager
def serve_files(files: dict[str, bytes], *, token: str | None = None) -> Iterator[FileServer]:
    server_state = FileServer("", files, token)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            auth = self.headers.get("Authorization")
            server_state.authorizations.append(auth)
            body = server_state.files.get(self.path)
            if server_state.token is not None and auth != f"Bearer {server_state.token}":
                status, body = 401, b""
            else:
                status, body = (200, body) if body is not None else (404, b"")
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server_state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server_state
    finally:
        httpd.shutdown()
        httpd.server_close()


def tar_gz(members: dict[str, bytes]) -> bytes:
    """A .tar.gz holding `members` (name -> bytes)."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
