"""A trivial worker stand-in for pod runner tests: HTTP on $ARDIFF_PORT.

GET /readyz is 200 while ready (toggled by POST /ready and POST /unready), GET /env returns the environment.
`--ignore-sigterm` keeps running after SIGTERM (to test the grace period), `--exit CODE` exits at once.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import sys
import threading

parser = argparse.ArgumentParser()
parser.add_argument("--ignore-sigterm", action="store_true")
parser.add_argument("--exit", type=int)
args = parser.parse_args()
if args.exit is not None:
    print(f"exiting with {args.exit}", flush=True)
    sys.exit(args.exit)

state = {"ready": True}


class Handler(http.server.BaseHTTPRequestHandler):
    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/env":
            self._reply(200, json.dumps(dict(os.environ)).encode())
        elif self.path == "/readyz":
            self._reply(200 if state["ready"] else 503, b"")
        else:
            self._reply(404, b"")

    def do_POST(self) -> None:
        state["ready"] = self.path == "/ready"
        self._reply(200, b"")

    def log_message(self, *_: object) -> None:
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["ARDIFF_PORT"])), Handler)


def on_sigterm(*_: object) -> None:
    print("got SIGTERM", flush=True)
    if not args.ignore_sigterm:
        threading.Thread(target=server.shutdown).start()


signal.signal(signal.SIGTERM, on_sigterm)
print(f"serving on {os.environ['ARDIFF_PORT']} as {os.environ.get('HOSTNAME')}", flush=True)
server.serve_forever()
print("stopped", flush=True)
