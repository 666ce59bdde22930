"""The shared tier (issue 12): exports of suspended sessions and snapshots, as files in a directory that every
pod of the pool mounts (an RWX volume on a cluster, a local directory on the dev cluster).

A location (what the placement store records) is a path relative to the tier's root, so pods may mount the
volume anywhere; `open` refuses one that leaves the root. A file is written under a temporary name, flushed to
disk and renamed, so a reader never sees a partial export (a crash mid-write leaves only a `.part` file).

A migration's export also names the pod that still holds the session (`suspend-<ns>-<id>@<pod>.ardsess`):
the pod it is placed on may pull it from there directly (`direct_source`, worker/transfer.py) and keeps this
file as the fallback. `@` cannot occur in a pod name, so the name parses back unambiguously; the store
records the location as an opaque string, so no record changes for it.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Literal

from ardiff.kv.records import check_name
from ardiff.worker.errors import ExportCorrupt

ExportKind = Literal["suspend", "snapshot"]
SUFFIX = ".ardsess"
HOLDER_MARK = "@"


def is_session_name(name: str) -> bool:
    try:
        check_name("session", name)
    except ValueError:
        return False
    return True


def direct_source(location: str) -> str | None:
    """The pod a migration's export names as still holding the session (None: no direct transfer)."""
    name = PurePosixPath(location).name
    if not name.endswith(SUFFIX) or HOLDER_MARK not in name:
        return None
    pod = name[: -len(SUFFIX)].rpartition(HOLDER_MARK)[2]
    return pod or None


class SharedTier:
    def __init__(self, root: str | Path, namespace: str, pool: str) -> None:
        self.root = Path(root).resolve()
        self._pool_dir = Path(namespace) / pool

    def write(
        self,
        session_id: str,
        kind: ExportKind,
        export: Callable[[BinaryIO], int],
        *,
        holder: str | None = None,
    ) -> tuple[str, int]:
        """Write one export with `export(file)` (which returns the bytes written); its location and size.
        `holder`: the pod that keeps the session for a direct transfer (named in the file's name)."""
        via = f"{HOLDER_MARK}{holder}" if holder else ""
        name = f"{kind}-{time.time_ns()}-{uuid.uuid4().hex[:8]}{via}{SUFFIX}"
        relative = self._pool_dir / session_id / name
        target = self.root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        try:
            with partial.open("wb", buffering=1 << 20) as out:
                size = export(out)
                out.flush()
                os.fsync(out.fileno())
            partial.rename(target)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        return str(relative), size

    def open(self, location: str) -> BinaryIO:
        """The export at `location` for reading; `ExportCorrupt` when it is not a file inside the tier."""
        path = (self.root / location).resolve()
        if not path.is_relative_to(self.root) or path.suffix != SUFFIX:
            raise ExportCorrupt(f"session export location {location!r} is not an export in the shared tier")
        try:
            return path.open("rb", buffering=1 << 20)
        except OSError as exc:
            raise ExportCorrupt(f"session export {location!r} cannot be read: {exc}") from None

    def remove(self, location: str) -> None:
        """Forget an export that is no longer needed (a replaced snapshot, a resumed suspension)."""
        path = (self.root / location).resolve()
        if path.is_relative_to(self.root) and path.suffix == SUFFIX:
            path.unlink(missing_ok=True)

    def sessions(self) -> list[str]:
        """The sessions of this pool that have files in the tier: directories named as a session can be (a
        volume's `lost+found`, or anything else put there, is not one of ours and is left alone)."""
        pool_dir = self.root / self._pool_dir
        if not pool_dir.is_dir():
            return []
        return sorted(
            entry.name for entry in pool_dir.iterdir() if entry.is_dir() and is_session_name(entry.name)
        )

    def forget_session(self, session_id: str) -> None:
        """Remove every file of a session (it was deleted: nothing will resume from them)."""
        shutil.rmtree(self.root / self._pool_dir / session_id, ignore_errors=True)
