"""A local HTTP(S) file server for offline download tests: serves `files` (path -> bytes) and `redirects`
(path -> a Location, answered 302), records each request's Authorization header, and answers 401 to requests
without `token` when one is set. `declare_length=False` sends bodies without a Content-Length (to the
connection's end); `tls` (a certificate and key) serves https."""

from __future__ import annotations

import http.server
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ardiff.devcluster.pki import KeyPair


@dataclass
class FileServer:
    url: str
    files: dict[str, bytes]
    token: str | None = None
    authorizations: list[str | None] = field(default_factory=list)


@contextmanager
def serve_files(
    files: dict[str, bytes],
    *,
    token: str | None = None,
    redirects: dict[str, str] | None = None,
    declare_length: bool = True,
    tls: KeyPair | None = None,
) -> Iterator[FileServer]:
    server_state = FileServer("", files, token)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            auth = self.headers.get("Authorization")
            server_state.authorizations.append(auth)
            body = server_state.files.get(self.path)
            location = (redirects or {}).get(self.path)
            if server_state.token is not None and auth != f"Bearer {server_state.token}":
                status, body = 401, b""
            elif location is not None:
                status, body = 302, b""
            else:
                status, body = (200, body) if body is not None else (404, b"")
            self.send_response(status)
            if location is not None and status == 302:
                self.send_header("Location", location)
            if declare_length:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls.cert, tls.key)
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    server_state.url = f"{'https' if tls else 'http'}://127.0.0.1:{httpd.server_address[1]}"
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
