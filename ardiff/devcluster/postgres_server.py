"""A throwaway PostgreSQL server (Debian's `postgresql` package) for helm's SQL release storage.

helm keeps releases in Secrets through client-go, which writes them as protobuf; the emulated API speaks JSON
only. With `HELM_DRIVER=sql` helm keeps them in PostgreSQL instead and talks to the API only for the chart's
objects (JSON), so the real `helm install/upgrade/uninstall` work against the dev cluster:

    with PostgresServer() as postgres:
        env = {**os.environ, **postgres.helm_env()}    # HELM_DRIVER, HELM_DRIVER_SQL_CONNECTION_STRING

The server trusts local connections (user `helm`), listens on 127.0.0.1 only and keeps its data in a fresh
directory under the system's temporary directory (reachable by the `postgres` user: PostgreSQL refuses to run
as root, so as root it runs as that user), removed on stop.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

from ardiff.devcluster.redis_server import free_port
from ardiff.errors import ArdiffError

USER = "helm"


class PostgresUnavailable(ArdiffError):
    code = "postgres_unavailable"


def postgres_bin(name: str) -> str | None:
    """`initdb`/`pg_ctl` from PATH, else from Debian's versioned directory (not on PATH)."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


class PostgresServer:
    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="ardiff-postgres-"))
        self.data = self.workdir / "data"
        self.port = 0
        self._as_root = os.geteuid() == 0

    @property
    def url(self) -> str:
        return f"postgres://{USER}@127.0.0.1:{self.port}/postgres?sslmode=disable"

    def helm_env(self) -> dict[str, str]:
        return {"HELM_DRIVER": "sql", "HELM_DRIVER_SQL_CONNECTION_STRING": self.url}

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", "postgres", "--"] if self._as_root else []
        return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=60, check=False)

    def start(self) -> Self:
        initdb, pg_ctl = postgres_bin("initdb"), postgres_bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise PostgresUnavailable("PostgreSQL is not installed (apt-get install postgresql)")
        if self._as_root:
            shutil.chown(self.workdir, "postgres", "postgres")
        result = self._run(initdb, "-D", str(self.data), "-U", USER, "--auth=trust", "--no-sync")
        if result.returncode != 0:
            raise PostgresUnavailable(f"initdb failed: {result.stderr.strip()}")
        self.port = free_port()
        options = f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = self.workdir / "postgres.log"
        result = self._run(pg_ctl, "-D", str(self.data), "-l", str(log), "-o", options, "-w", "start")
        if result.returncode != 0:
            raise PostgresUnavailable(f"pg_ctl start failed: {result.stderr.strip()} {result.stdout.strip()}")
        return self

    def stop(self) -> None:
        pg_ctl = postgres_bin("pg_ctl")
        if pg_ctl is not None and self.data.exists():
            self._run(pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
