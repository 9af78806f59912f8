"""serve's request log: every request, failed ones too, as JSONL (mode 0600), with the harness's mark."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

from eu_audit.errors import BadInput
from eu_audit.serve.api import (
    LogEntry,
    LogMark,
)


def open_log(path: Path, *, force: bool) -> int:
    """The log's file descriptor: created 0600, never through a symlink, an existing file only with
    ``force`` (then emptied and made 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | (os.O_TRUNC if force else os.O_EXCL), 0o600)
    except FileExistsError:
        raise BadInput(
            "exists; pass --force to replace it (eu-audit never overwrites silently)", path=str(path)
        ) from None
    except OSError as exc:  # ELOOP: a symlink at the path
        raise BadInput(f"cannot open the log: {exc.strerror}", path=str(path)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BadInput("is not a regular file", path=str(path))
    os.fchmod(fd, 0o600)
    return fd


class RequestLog:
    """Every request, in memory and as JSONL (0600). Lines carry a sequence number and the harness's
    current mark; the file is append-only and flushed per line."""

    def __init__(self, path: Path | None, *, force: bool = False) -> None:
        self.entries: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._file = None
        self.path = path
        if path is not None:
            self._file = os.fdopen(open_log(path, force=force), "w", encoding="utf-8")
        self._digest = hashlib.sha256()

    def add(self, mark: LogMark | None = None, **fields: Any) -> dict[str, Any]:
        with self._lock:
            entry = LogEntry(seq=len(self.entries), time=round(time.time(), 3), mark=mark, **fields)
            row = entry.model_dump(mode="json", exclude_none=True)
            self.entries.append(row)
            line = json.dumps(row, ensure_ascii=False) + "\n"
            self._digest.update(line.encode())
            if self._file is not None:
                self._file.write(line)
                self._file.flush()
            return row

    def since(self, seq: int) -> list[dict[str, Any]]:
        with self._lock:
            return self.entries[seq:]

    def digest(self) -> str:
        with self._lock:
            return self._digest.copy().hexdigest()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
