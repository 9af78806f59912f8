"""Forensics below the API: eu-audit reads the files an agent persists a tenant in, without trusting its
``dump``.

An agent's dump is its own word. The deletion bugs users report mostly live below it: a cascade that never
fires (SQLite leaves ``PRAGMA foreign_keys`` off, so ``ON DELETE CASCADE`` is inert and child rows stay),
rows deleted but physically present (free pages, WAL frames and journals keep them until a checkpoint or
``VACUUM`` unless ``secure_delete`` is on), a vector twin deleted in one store and not in the other. After
the forget (and after each recheck) the harness reads every file the agent names (``files`` in the
contract, or ``eu-audit gate --store-path``) and counts, per tenant, four channels:

- ``rows``: rows of any table, any column, whose text holds z (SQLite databases, read from a copy, WAL
  applied, so the agent's files are never changed);
- ``orphans``: rows whose declared parent (a foreign key) is gone: what a cascade should have removed;
- ``bytes``: places in the raw bytes of every file (main database, ``-wal``, ``-journal``, any other file)
  that hold z, live or deleted, named by file and page: "logically deleted, physically present"; z's
  exact bytes, and z as an agent may have written it (escaped, NFD, wrapped, base64, in a gzip, zlib or
  zstd stream: ``file_text``), the form named beside the place;
- ``vectors``: stored vectors (a BLOB of float32 of the embedder's width) within cosine ``VECTOR_MATCH`` of
  the embedding of a text holding z that the agent itself embedded through serve's ``/v1/embeddings``
  (serve logs those inputs), or of z itself: "an embedding of z remains", named by table and row. A
  BLOB of several vectors is read slot by slot: sqlite-vec's ``vec0`` tables keep their vectors in
  chunks (``NAME_vector_chunksNN.vectors``), read through their plain shadow tables (eu-audit never loads
  the extension), so a deleted embedding whose bytes a release left in its chunk is found and said to be
  marked deleted (the chunk's validity bit cleared).

A file eu-audit cannot read is "not measured", named, never clean. Every count says where it came from:
read by eu-audit (these), or reported by the agent's dump (``store_residue``).
"""

from __future__ import annotations

import math
import shutil
import sqlite3
import struct
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Any

from eu_audit.blackbox.file_text import blob_text, compressed_places, text_places
from eu_audit.matching import TargetMatcher
from eu_audit.tiers import DISK_TIERS
from eu_audit.trace.records import AGENT_METHOD
from eu_audit.trace.session import SessionTrace

#: cosine similarity at which a stored vector is taken for the embedding of a text holding z (the same
#: text through the same embedder gives 1.0 up to float rounding; a paraphrase stays well below)
VECTOR_MATCH = 0.98
SQLITE_MAGIC = b"SQLite format 3\x00"
#: files larger than this are not read (named as not measured)
MAX_FILE_BYTES = 512 << 20
Embed = Callable[[Sequence[str]], list[list[float]]]


@dataclass(frozen=True)
class Found:
    """One place holding z (or an orphan): its channel, file, where in it, how many, and whether it is the
    tenant's own (a row naming the tenant) rather than a place any tenant sharing the file could own."""

    tier: str
    file: str
    where: str
    n: int = 1
    own: bool = False


@dataclass
class DiskReport:
    """What eu-audit found in one tenant's files, and the files it could not read (with why)."""

    found: list[Found] = field(default_factory=list)
    read: list[str] = field(default_factory=list)
    unread: dict[str, str] = field(default_factory=dict)
    tenant: str = ""
    #: files among those read that the agent wrote and did not name (``undeclared``)
    undeclared: list[str] = field(default_factory=list)

    def add(self, tier: str, file: str, where: str, n: int = 1, own: bool = False) -> None:
        self.found.append(Found(tier, file, where[:300], n, own))

    def counts(
        self, shared: frozenset[str] | set[str] = frozenset()
    ) -> tuple[dict[str, int], dict[str, str], dict[str, str]]:
        """(channel -> count, channel -> its places, file -> why not measured) for this tenant. A file
        that other tenants of the run keep their data in too (``shared``) counts only rows that name this
        tenant; its raw bytes cannot be told apart, so z there is said (the example), never counted.
        A channel's places are one per table (raw bytes: per file), every file's first before any file's
        second, up to ``PLACES_SHOWN``, joined by "; ": a reader sees every file and table that kept z, not
        only the first one read."""
        counts, examples = dict.fromkeys(DISK_TIERS, 0), dict[str, str]()
        places: dict[str, dict[str, str]] = {}  # tier -> table (file: table.column) -> its first place
        unread = dict(self.unread)
        unattributed: list[str] = []
        for f in self.found:
            if f.file in shared and not f.own:
                if f.tier == "bytes" and Path(f.file).name not in unattributed:
                    unattributed.append(Path(f.file).name)
                continue
            counts[f.tier] += f.n
            place = f"{Path(f.file).name}: {f.where}"
            key = Path(f.file).name if f.tier == "bytes" else place.split(" (")[0]  # a file's first page
            places.setdefault(f.tier, {}).setdefault(key, place)
        for tier, seen in places.items():
            # every file's first table before any file's second: a file is never hidden behind another's
            # tables (mem0's history rows used to push Chroma's embeddings_queue out of the example)
            by_file: dict[str, list[str]] = {}
            for place in seen.values():
                by_file.setdefault(place.split(": ")[0], []).append(place)
            rounds = zip_longest(*by_file.values())
            ordered = [place for row in rounds for place in row if place is not None]
            shown = ordered[:PLACES_SHOWN]
            more = len(seen) - len(shown)
            examples[tier] = "; ".join(shown) + (f"; and {more} more" if more else "")
        if unattributed and not counts["bytes"]:  # said, not counted: no tenant can be held to them
            examples["bytes"] = (
                f"not attributed: z in the raw bytes of {', '.join(unattributed)}, which other tenants of "
                "the run share"
            )
        return counts, examples, unread


#: how many tables (or file regions) a disk channel's example names
PLACES_SHOWN = 3


def _copy(db: Path, into: Path) -> list[Path]:
    """The database with its ``-wal`` and ``-journal`` beside it, copied: reading a live WAL database would
    write its ``-shm``, and a copy leaves the agent's files as they were. The journals first: SQLite
    deletes a WAL when its last connection closes, after checkpointing it into the database, so a WAL
    gone before its copy left its pages in the database copied after it (never the other way round).
    Returns the copies, the database first."""
    got = []
    for suffix in ("-wal", "-journal", ""):
        src = db.with_name(db.name + suffix)
        try:
            shutil.copyfile(src, into / (db.name + suffix))
        except FileNotFoundError:
            if not suffix:
                raise
            continue  # checkpointed and removed: its pages are in the database
        got.append(into / (db.name + suffix))
    return [got[-1], *got[:-1]]


def _text_of(value: Any) -> str | None:
    """A cell's text: a string, or a BLOB's (``file_text.blob_text``: opened where compressed)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return blob_text(value)
    return None


def _vector_of(value: Any, width: int) -> list[float] | None:
    if not isinstance(value, bytes) or width <= 0 or len(value) != 4 * width:
        return None
    vec = list(struct.unpack(f"<{width}f", value))
    return vec if all(math.isfinite(x) for x in vec) else None


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _tables(con: sqlite3.Connection) -> list[str]:
    """The database's plain tables. A virtual table (sqlite-vec's ``vec0``, FTS5) needs its module to be
    read, which a plain reader lacks ("no such module"); its rows live in plain shadow tables (``v_chunks``,
    ``v_vector_chunks00``, ``f_content``), read instead."""
    rows = con.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
        "AND coalesce(upper(sql), '') NOT LIKE 'CREATE VIRTUAL TABLE%'"
    )
    return [str(r[0]) for r in rows]


def _slots(value: Any, width: int) -> list[tuple[int, list[float]]]:
    """The vectors a BLOB holds: one of ``width`` float32, or several side by side (a vector chunk), each
    with its slot; empty slots (all zero) and bytes that are not finite floats are left out."""
    if not isinstance(value, bytes) or width <= 0 or not value or len(value) % (4 * width):
        return []
    size = 4 * width
    got = []
    for slot in range(len(value) // size):
        vec = _vector_of(value[slot * size : (slot + 1) * size], width)
        if vec is not None and any(vec):
            got.append((slot, vec))
    return got


#: sqlite-vec's vector chunk tables, and the chunk table whose ``validity`` bitmap says which slot is live
VEC0_CHUNKS = "_vector_chunks"


def _validity(con: sqlite3.Connection, table: str, tables: list[str]) -> dict[int, bytes]:
    """chunk id -> its validity bitmap, for a sqlite-vec vector chunk table (``{}`` for any other)."""
    base, sep, _ = table.rpartition(VEC0_CHUNKS)
    chunks = f"{base}_chunks"
    if not sep or chunks not in tables:
        return {}
    try:
        rows = con.execute(f"SELECT chunk_id, validity FROM {_quote(chunks)}").fetchall()
    except sqlite3.Error:
        return {}
    return {int(r[0]): bytes(r[1]) for r in rows if isinstance(r[1], bytes)}


def _slot_said(slot: int, many: bool, valid: bytes | None) -> str:
    if not many:
        return ""
    if valid is None or slot // 8 >= len(valid):
        return f", slot {slot}"
    live = valid[slot // 8] >> (slot % 8) & 1
    return f", slot {slot}" + ("" if live else ", marked deleted")


def _names(row: Sequence[Any], tenant: str) -> bool:
    return bool(tenant) and any(isinstance(v, str) and tenant in v for v in row)


def _rows_and_vectors(
    con: sqlite3.Connection,
    file: str,
    matcher: TargetMatcher,
    targets: list[list[float]],
    report: DiskReport,
) -> None:
    width = len(targets[0]) if targets else 0
    tables = _tables(con)
    for table in tables:
        validity = _validity(con, table, tables)
        try:  # the rowid names a vector chunk; a WITHOUT ROWID table has none
            cur = con.execute(f"SELECT rowid AS _rowid_, * FROM {_quote(table)}")
        except sqlite3.OperationalError:
            cur = con.execute(f"SELECT NULL AS _rowid_, * FROM {_quote(table)}")
        cols = [d[0] for d in cur.description][1:]
        for i, (rowid, *row) in enumerate(cur):
            key = next((str(v)[:60] for v in row if isinstance(v, str | int)), f"row {i + 1}")
            own = _names(row, report.tenant)
            for col, value in zip(cols, row, strict=True):
                text = _text_of(value)
                if text is not None and matcher.found_in(text):
                    report.add("rows", file, f"{table}.{col} ({key})", own=own)
                slots = _slots(value, width)
                for slot, vec in slots:
                    if any(_cosine(vec, t) >= VECTOR_MATCH for t in targets):
                        said = _slot_said(slot, len(value) > 4 * width, validity.get(rowid))
                        where = f"{table}.{col} ({key}{said}): an embedding of a text holding z"
                        report.add("vectors", file, where, own=own)


def _orphans(con: sqlite3.Connection, file: str, report: DiskReport) -> None:
    """Rows whose declared parent row is gone (each foreign key, whatever ``PRAGMA foreign_keys`` says)."""
    tables = _tables(con)
    for table in tables:
        keys: dict[int, list[tuple[str, str, Any]]] = {}
        for fk in con.execute(f"PRAGMA foreign_key_list({_quote(table)})"):
            keys.setdefault(int(fk[0]), []).append((str(fk[2]), str(fk[3]), fk[4]))
        for parts in keys.values():
            parent = parts[0][0]
            if parent not in tables:
                continue
            to = [p[2] for p in parts]
            if any(t is None for t in to):  # the parent's primary key
                pk = [str(r[1]) for r in con.execute(f"PRAGMA table_info({_quote(parent)})") if r[5]]
                to = pk or ["rowid"]
            child = [_quote(p[1]) for p in parts]
            match = " AND ".join(f"p.{_quote(str(t))} = c.{c}" for t, c in zip(to, child, strict=True))
            present = " AND ".join(f"c.{c} IS NOT NULL" for c in child)
            sql = (
                f"SELECT c.* FROM {_quote(table)} c WHERE {present} AND NOT EXISTS "
                f"(SELECT 1 FROM {_quote(parent)} p WHERE {match})"
            )
            gone = con.execute(sql).fetchall()
            cols = ", ".join(p[1] for p in parts)
            for own in (True, False):
                n = sum(_names(r, report.tenant) == own for r in gone)
                if n:
                    said = f"{table}({cols}) -> {parent}: {n} row(s) whose parent is gone"
                    report.add("orphans", file, said, n, own=own)


def _bytes(
    path: Path, file: str, matcher: TargetMatcher, page: int, report: DiskReport, shown: Path | None = None
) -> None:
    """z in the raw bytes of ``path`` (the file, or a copy of ``shown``), as UTF-8 (and UTF-16 for SQLite's
    other encodings), named by place: a database's page, a WAL's frame (32-byte header, then frames of
    24 + page bytes), a journal's byte, a file's byte."""
    raw = path.read_bytes()
    needles = {v for v in matcher.variants if v}
    name = shown or path

    def place(at: int) -> str:
        if name.name.endswith("-wal") and page:
            return f"{name.name}, WAL frame {max(0, at - 32) // (page + 24) + 1}"
        if page and str(name) == file:
            return f"page {at // page + 1}"
        if str(name) == file:  # a file of its own (JSON, a log): named once, by the place it is read as
            return f"byte {at}"
        return f"{name.name}, byte {at}"

    exact: set[int] = set()
    for text in needles:
        for form in {text, text.lower(), text.upper(), text.title()}:
            for enc in ("utf-8", "utf-16-le", "utf-16-be"):
                pat = form.encode(enc)
                at = raw.find(pat)
                while at >= 0:
                    exact.add(at)
                    report.add("bytes", file, place(at))
                    at = raw.find(pat, at + len(pat))
    # z as the agent may have written it: escaped, NFD, wrapped, encoded, compressed (file_text)
    for at, how in [*text_places(raw, matcher, exact), *compressed_places(raw, matcher)]:
        report.add("bytes", file, f"{place(at)} ({how})")


def _page_size(db: Path) -> int:
    with open(db, "rb") as f:
        head = f.read(100)
    size = int.from_bytes(head[16:18], "big") if len(head) >= 18 else 0
    return 65536 if size == 1 else size


def read_files(
    paths: Iterable[str | Path],
    matcher: TargetMatcher,
    *,
    embedded: Sequence[str] = (),
    embed: Embed | None = None,
    tenant: str = "",
) -> DiskReport:
    """Every channel of ``DISK_TIERS`` over the files ``paths`` (a directory: every file under it).
    ``embedded``: the texts holding z that the agent embedded (serve's log); with ``embed`` (serve's own
    embedder) stored vectors are compared with theirs and z's. ``tenant``: its name, so that a row naming
    it is known to be its own in a file tenants share."""
    report = DiskReport(tenant=tenant)
    files: list[Path] = []
    for given in paths:
        p = Path(given)
        files += sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]
    targets: list[list[float]] = []
    if embed is not None:
        texts = list(dict.fromkeys([*embedded, *matcher.variants]))
        try:
            targets = embed(texts) if texts else []
        except Exception as exc:  # no embedder: the vector channel is not measured, never clean
            report.unread["(vectors)"] = f"no embedding of z could be made ({type(exc).__name__})"
    dbs = {f for f in files if _is_sqlite(f)}
    # a database's WAL and journal hold its recent and its deleted pages too: read with it, from copies
    sidecars = {d.with_name(d.name + s) for d in dbs for s in ("-wal", "-journal")}
    files = [f for f in dict.fromkeys(files) if f not in sidecars]
    for f in files:
        try:
            if not f.is_file():
                report.unread[str(f)] = "no such file"
                continue
            if f.stat().st_size > MAX_FILE_BYTES:
                report.unread[str(f)] = f"over {MAX_FILE_BYTES >> 20} MiB"
                continue
            if f not in dbs:
                _bytes(f, str(f), matcher, 0, report)
                report.read.append(str(f))
                continue
            with tempfile.TemporaryDirectory(prefix="eu-audit-forensics-") as tmp:
                copies = _copy(f, Path(tmp))
                page = _page_size(copies[0])
                for c in copies:  # named as the agent's files: page N, WAL frame N
                    _bytes(c, str(f), matcher, page, report, shown=f.with_name(c.name))
                con = sqlite3.connect(f"file:{copies[0]}?mode=ro", uri=True)
                try:
                    _rows_and_vectors(con, str(f), matcher, targets, report)
                    _orphans(con, str(f), report)
                finally:
                    con.close()
            report.read += [str(f.with_name(c.name)) for c in copies]
        except (OSError, sqlite3.Error) as exc:
            report.unread[str(f)] = f"{type(exc).__name__}: {exc}"[:200]
    return report


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def attach_disks(
    traces: Iterable[SessionTrace], disks: dict[str, DiskReport], names: dict[tuple[str, str], str]
) -> None:
    """Keep each tenant's forensic counts on its first check's residue record. A file more than one
    tenant of the run keeps its data in counts for a tenant only through rows that name it."""
    listed: dict[str, int] = {}
    for report in disks.values():
        for f in {*report.read, *report.unread, *(x.file for x in report.found)}:
            listed[f] = listed.get(f, 0) + 1
    shared = {f for f, n in listed.items() if n > 1}
    for trace in traces:
        name = names.get((trace.session_id.split("/")[0], trace.session.method or AGENT_METHOD), "")
        mine = disks.get(name)
        if mine is None or not trace.residues:
            continue
        counts, examples, unread = mine.counts(shared)
        update = {
            "disk": counts,
            "disk_examples": examples,
            "disk_unread": unread,
            "disk_files": len(mine.read),
            "disk_undeclared": list(mine.undeclared),
        }
        trace.residues[0] = trace.residues[0].model_copy(update=update)
