"""The local model cache verifies itself.

A converted model (or a GGUF joined from parts) is a folder with a marker, ``eu-audit-model.json``: the
source's sha256 and, per file, its size and sha256, written when the folder is made. Before a folder is
loaded, every file is hashed again and compared with the marker (``verify_for_load``; 0.4-0.6 s for the
491 MB default model here), so the digest a bundle records is the digest of the bytes loaded: a byte
flipped with its modification time kept is caught. Within one process a folder whose files keep their
size, times and inode (ctime included, which no write can set back) is not hashed twice. A mismatch
or a missing file means the folder cannot be trusted: the caller converts again from the verified
source, or fails with exit 3 naming the file.

The marker is written into the cache, so anyone who can write the cache can rewrite it too. Where the
model registry pins a file's digest in code (the shipped GGUF of each default model, which the joined
``model.gguf`` must equal; the de-quantized weights of a default model, under the pinned torch and
transformers), that file is checked against the pin, not the marker, and so is the marker's source
digest: a rewritten marker cannot make altered weights load under the original digest.

``eu-audit models`` lists folders against a cheaper stamp (size and mtime at the last verification);
``models --verify`` hashes them all, says what each was checked against, and exits 1 when one is broken
(the next load rebuilds it).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

MARKER = "eu-audit-model.json"
STAMP = ".eu-audit-verified.json"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (MARKER, STAMP))


def write_marker(folder: Path, name: str, source_sha256: str) -> None:
    """Record what the folder holds, file by file (called on a fresh folder, before it is renamed into
    place)."""
    files = {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": sha256_of(p)} for p in _files(folder)
    }
    (folder / MARKER).write_text(json.dumps({"name": name, "source_sha256": source_sha256, "files": files}))


def source_digest(folder: Path) -> str | None:
    try:
        return str(json.loads((folder / MARKER).read_text())["source_sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class Pins:
    """What the registry pins for one cache folder: the source's sha256, and some files' own sha256."""

    source: str | None = None
    files: dict[str, str] | None = None

    def describe(self) -> str:
        pinned = sorted(self.files or {})
        if not pinned:
            return "the marker written at conversion" + (" (its source digest pinned)" if self.source else "")
        return f"the registry's pinned sha256 ({', '.join(pinned)}); the marker for the rest"


@dataclass(frozen=True)
class CacheCheck:
    ok: bool
    problem: str = ""  # what is wrong, naming the file

    def __bool__(self) -> bool:
        return self.ok


def verify(folder: Path, *, force: bool = False, pins: Pins | None = None) -> CacheCheck:
    """Is the folder what its marker says, and what the registry pins (``pins``)? Cheap when nothing
    changed since the last verification (a pinned file is hashed whenever ``force``)."""
    pins = pins or Pins()
    try:
        marker = json.loads((folder / MARKER).read_text())
        expected: dict[str, dict[str, object]] = marker["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return CacheCheck(False, f"{folder / MARKER}: missing or unreadable (an incomplete or older cache)")
    if pins.source and marker.get("source_sha256") != pins.source:
        why = "names another source than the registry pins (rewritten)"
        return CacheCheck(False, f"{folder / MARKER}: {why}")
    for rel in pins.files or {}:
        if rel not in expected:
            return CacheCheck(False, f"{folder / rel}: pinned by the registry, missing from the marker")
    try:
        stamp = json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        stamp = {}
    fresh: dict[str, list[int]] = {}
    for rel, meta in expected.items():
        path = folder / rel
        try:
            st = path.stat()
        except OSError:
            return CacheCheck(False, f"{path}: missing from the model cache")
        if st.st_size != meta.get("size"):
            return CacheCheck(
                False, f"{path}: {st.st_size} bytes, expected {meta.get('size')} (truncated or altered)"
            )
        now = [st.st_size, st.st_mtime_ns]
        if not force and stamp.get(rel) == now:
            fresh[rel] = now
            continue
        want = (pins.files or {}).get(rel, meta.get("sha256"))
        if sha256_of(path) != want:
            against = "the registry pins" if rel in (pins.files or {}) else "the one written at conversion"
            return CacheCheck(False, f"{path}: its sha256 differs from the one {against} (altered)")
        fresh[rel] = now
    tmp = folder / f"{STAMP}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(fresh))
        os.replace(tmp, folder / STAMP)
    except OSError:
        pass  # a read-only cache still verifies; it will hash again next time
    return CacheCheck(True)


#: folder -> its files' (name, size, mtime, ctime, inode) when it last verified in full, in this process
_VERIFIED: dict[Path, list[tuple[str, int, int, int, int]]] = {}


def _stats(folder: Path) -> list[tuple[str, int, int, int, int]]:
    """What changes when a file is written, mtime kept or not (ctime cannot be set back)."""
    out = []
    for p in _files(folder):
        st = p.stat()
        out.append((str(p.relative_to(folder)), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    return out


def verify_for_load(folder: Path, pins: Pins | None = None) -> CacheCheck:
    """``verify`` with every file hashed, as a folder is about to be loaded."""
    try:
        stats = _stats(folder)
    except OSError as exc:
        return CacheCheck(False, f"{folder}: {exc.strerror}")
    if _VERIFIED.get(folder) == stats:
        return CacheCheck(True)
    verdict = verify(folder, force=True, pins=pins)
    if verdict:
        _VERIFIED[folder] = stats
    else:
        _VERIFIED.pop(folder, None)
    return verdict
