"""Forensics below the API: eu-audit reads an agent's files itself, so what its dump leaves out still counts.
A SQLite-backed agent (``tests/sqlite_agent.py``) whose dump hides the rows that hold z, whose delete
leaves z's bytes in the WAL and free pages, or whose cascade never fires fails the gate naming the table,
the file and page, or the orphaned vectors; the same agent deleting with ``secure_delete`` and a checkpoint
holds. The tiny model over HTTP (serve's embeddings): seconds."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eu_audit.audit import AuditOptions, audit
from eu_audit.audits.gate import evaluate
from eu_audit.blackbox.drive import AgentRecordOptions, Bounds, record_agent
from eu_audit.blackbox.forensics import read_files
from eu_audit.matching import TargetMatcher
from eu_audit.models import TINY_MODEL

from .helpers import cli_server


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("serve")
    control = folder / "serve.control"
    args = ["serve", "--model", TINY_MODEL, "--engine", "hf", "--log", str(folder / "serve.jsonl")]
    with cli_server(*args, "--control-file", str(control)) as url:
        yield url, control


def _gate(serve: tuple[str, Path], mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    url, control = serve
    monkeypatch.setenv("EU_AUDIT_TEST_SERVE", url)
    out = tmp_path / f"{mode}.jsonl"
    opts = AgentRecordOptions(
        agent=f"tests.sqlite_agent:{mode}",
        serve=url,
        serve_control=control,
        suite="builtin",
        n=1,
        k=1,
        out=out,
        bounds=Bounds(call_s=60),
    )
    record_agent(opts)
    report = audit(out, AuditOptions())
    rules = ["agent.residue_store==0", "agent.residue_disk==0", "agent.bystander==0"] + [
        f"agent.disk.{t}==0" for t in ("rows", "orphans", "bytes", "vectors")
    ]
    got = {g.rule: g for g in evaluate(report, rules)}
    agent = next(s for s in report.states if s.method == "agent")
    from eu_audit.audits.output import summary_lines

    return {"gates": got, "residue": agent.residue, "summary": "\n".join(summary_lines(report))}


def test_a_dump_that_hides_the_rows_holding_z_fails_naming_the_table(
    serve: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    got = _gate(serve, "hiding", tmp_path, monkeypatch)
    gates = got["gates"]
    assert gates["agent.residue_store==0"].outcome == "held"  # the agent's own word: nothing left
    assert gates["agent.disk.rows==0"].outcome == "failed"  # eu-audit's read: the rows are there
    assert gates["agent.residue_disk==0"].outcome == "failed"
    assert "messages.content" in got["residue"].disk_example or "memories.text" in got["residue"].disk_example


def test_a_delete_without_secure_delete_leaves_z_in_the_files_bytes_and_one_with_it_holds(
    serve: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _gate(serve, "plain", tmp_path, monkeypatch)
    assert plain["gates"]["agent.disk.rows==0"].outcome == "held"  # the rows are gone
    assert plain["gates"]["agent.disk.bytes==0"].outcome == "failed"  # their bytes are not
    where = plain["residue"].disk_example
    assert ("page" in where or "WAL frame" in where) and ".sqlite" in where, where
    secure = _gate(serve, "secure", tmp_path, monkeypatch)
    for rule in (
        "agent.residue_disk==0",
        "agent.disk.bytes==0",
        "agent.disk.rows==0",
        "agent.disk.vectors==0",
        "agent.disk.orphans==0",  # its control: the no-forget tenant held z in the files a forget must clean
    ):
        assert secure["gates"][rule].outcome == "held", (rule, secure["gates"][rule].detail)
    assert secure["gates"]["agent.residue_disk==0"].outcome == "held"


def test_a_cascade_that_never_fires_leaves_orphaned_vectors_of_z(
    serve: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    got = _gate(serve, "cascade", tmp_path, monkeypatch)
    gates = got["gates"]
    assert gates["agent.disk.orphans==0"].outcome == "failed", gates["agent.disk.orphans==0"].detail
    assert gates["agent.disk.vectors==0"].outcome == "failed", gates["agent.disk.vectors==0"].detail
    assert gates["agent.disk.rows==0"].outcome == "held"


def test_a_file_that_cannot_be_read_is_not_measured_never_clean(tmp_path: Path) -> None:
    db = tmp_path / "t.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE notes (text TEXT)")
    con.execute("INSERT INTO notes VALUES ('lives at 12 Linden Street')")
    con.commit()
    con.close()
    m = TargetMatcher.of("12 Linden Street")
    report = read_files([db, tmp_path / "missing.sqlite"], m)
    counts, _, unread = report.counts()
    assert counts["rows"] == 1 and counts["bytes"] >= 1
    assert str(tmp_path / "missing.sqlite") in unread


def test_z_written_in_any_form_an_agent_writes_it_is_found_and_the_form_named(tmp_path: Path) -> None:
    """json.dump's escapes, NFD, a line wrap, base64, gzip, zlib and zstd: each file holds z, none byte
    for byte, and each is found with its form named; the same forms of another text are clean."""
    import base64
    import gzip
    import json
    import unicodedata
    import zlib

    import zstandard

    forms: dict[str, Callable[[str], bytes]] = {
        "escaped.json": lambda t: json.dumps({"name": t}).encode(),  # \u00e9: json.dump's default
        "nfd.txt": lambda t: unicodedata.normalize("NFD", t).encode(),
        "wrapped.txt": lambda t: t.replace(", ", ",\n").encode(),
        "b64.txt": lambda t: b"blob: " + base64.b64encode(t.encode()),
        "cache.gz": lambda t: gzip.compress(t.encode()),
        "cache.zlib": lambda t: b"\x00\x01" + zlib.compress(json.dumps([t]).encode()),
        "cache.zst": lambda t: zstandard.ZstdCompressor().compress(t.encode()),
    }
    z, clean = "José García, Calle Mayor 5", "Jane Doe, Calle Menor 6"
    m = TargetMatcher.of(z)
    for folder, text in (("z", z), ("clean", clean)):
        (tmp_path / folder).mkdir()
        for name, write in forms.items():
            (tmp_path / folder / name).write_bytes(write(text))
    kind = {"gz": "gzip", "zlib": "zlib", "zst": "zstd"}
    for name, write in forms.items():
        counts, examples, _ = read_files([tmp_path / "z" / name], m).counts()
        assert counts["bytes"] >= 1 and f"{name}: byte " in examples["bytes"], (name, examples)
        if name.startswith("cache."):  # a short text may stay literal in the stream: opened all the same
            assert f"in a {kind[name.split('.')[1]]} stream" in str(
                read_files([tmp_path / "z" / name], m).found
            )
        else:
            assert z.encode() not in write(z) and counts["bytes"] == 1, (name, examples)
    said = read_files([tmp_path / "z" / "b64.txt"], m).counts()[1]["bytes"]
    assert said == "b64.txt: byte 0 (base64)", said
    counts, examples, _ = read_files([tmp_path / "clean"], m).counts()
    assert counts["bytes"] == 0, examples


def test_z_kept_in_two_tables_is_named_in_both_not_only_the_first_read(tmp_path: Path) -> None:
    db = tmp_path / "t.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE history (text TEXT)")
    con.execute("CREATE TABLE queue (text TEXT)")  # e.g. Chroma's embeddings_queue beside mem0's history
    for table in ("history", "history", "queue"):
        con.execute(f"INSERT INTO {table} VALUES ('lives at 12 Linden Street')")
    con.commit()
    con.close()
    counts, examples, _ = read_files([db], TargetMatcher.of("12 Linden Street")).counts()
    assert counts["rows"] == 3
    said = examples["rows"]
    assert said.count("t.sqlite: history.text") == 1 and "t.sqlite: queue.text" in said
    # a second file is named even where the first has more tables holding z than the example shows
    other = tmp_path / "u.sqlite"
    con = sqlite3.connect(other)
    for table in ("a", "b", "c", "d"):
        con.execute(f"CREATE TABLE {table} (text TEXT)")
        con.execute(f"INSERT INTO {table} VALUES ('lives at 12 Linden Street')")
    con.commit()
    con.close()
    _, examples, _ = read_files([other, db], TargetMatcher.of("12 Linden Street")).counts()
    assert "t.sqlite: " in examples["rows"] and examples["rows"].endswith("; and 3 more")


def test_a_forget_that_wipes_other_tenants_fails_the_bystander_gate_and_a_careful_one_keeps_them(
    serve: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wiped = _gate(serve, "overdelete", tmp_path, monkeypatch)
    assert wiped["gates"]["agent.bystander==0"].outcome == "failed", wiped["gates"][
        "agent.bystander==0"
    ].detail
    assert "lost another tenant's memories" in wiped["summary"], wiped["summary"]
    careful = _gate(serve, "secure", tmp_path, monkeypatch)
    assert careful["gates"]["agent.bystander==0"].outcome == "held"
    assert "a bystander tenant kept every memory" in careful["summary"]


def test_a_forget_that_changes_nothing_is_reported_as_a_no_op(
    serve: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eu_audit.audits.output import summary_lines

    monkeypatch.setenv("EU_AUDIT_TEST_SERVE", serve[0])
    out = tmp_path / "naive.jsonl"
    opts = AgentRecordOptions(
        agent="tests.scripted_agents:naive", serve=serve[0], serve_control=serve[1], suite="builtin",
        n=1, k=1, out=out, bounds=Bounds(call_s=60),
    )  # fmt: skip
    bundle, _ = record_agent(opts)
    forget = next(s for s in bundle.sessions if s.session.method == "agent").agent_forgets[0]
    assert forget.changed is False
    said = "\n".join(summary_lines(audit(out, AuditOptions())))
    assert "agent: its forget changed nothing its own dump shows (a no-op) in 1 of 1 session(s)" in said, said


def test_store_path_names_the_files_of_an_agent_that_does_not_and_the_rows_it_hides_still_count(
    serve: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """record --agent --store-path '<dir>/{tenant}.sqlite': the same hiding agent, now silent about its
    files (no 'files' in its capabilities), is read all the same."""
    root = tmp_path / "agent-data"
    monkeypatch.setenv("SQLITE_AGENT_ROOT", str(root))
    monkeypatch.setenv("SQLITE_AGENT_NO_FILES", "1")
    monkeypatch.setenv("EU_AUDIT_TEST_SERVE", serve[0])
    out = tmp_path / "b.jsonl"
    opts = AgentRecordOptions(
        agent="tests.sqlite_agent:hiding", serve=serve[0], serve_control=serve[1], suite="builtin", n=1,
        k=1, out=out, bounds=Bounds(call_s=60), store_paths=(str(root / "{tenant}.sqlite"),),
    )  # fmt: skip
    record_agent(opts)
    report = audit(out, AuditOptions())
    got = {g.rule: g.outcome for g in evaluate(report, ["agent.residue_store==0", "agent.disk.rows==0"])}
    assert got == {"agent.residue_store==0": "held", "agent.disk.rows==0": "failed"}, got


def test_a_bystander_memory_gone_from_its_store_is_lost_even_if_a_history_table_still_quotes_it() -> None:
    from eu_audit.blackbox import bystander
    from eu_audit.blackbox.contract import StoredItem, StoreDump

    texts = [text for _, text, _ in bystander.RECORDS]
    before = StoreDump(items=[StoredItem(store=s, text=t) for t in texts for s in ("memory", "history")])
    history_only = StoreDump(items=[StoredItem(store="history", text=f"ADD: {t}") for t in texts])
    got = bystander.kept(before, history_only)  # mem0#3746: the vector store reset, the history rows left
    assert got.lost == len(texts) and "gone from memory" in got.example
    rewritten = StoreDump(  # a library that rewrites what it stores still keeps it, by the phrase
        items=[StoredItem(store=s, text=t.upper()) for t in texts for s in ("memory", "history")]
    )
    assert bystander.kept(before, rewritten).lost == 0


def test_files_the_agents_process_writes_and_does_not_name_are_found_and_its_own_output_is_not(
    tmp_path: Path,
) -> None:
    """A real process listening on a port (Linux /proc): a file it holds open and a cache it wrote and
    closed are undeclared; the store it names, the store's -wal, its redirected stdout and a file older
    than the tenant's window are not."""
    import os
    import socket
    import subprocess
    import sys
    import time

    from eu_audit.blackbox.undeclared import UndeclaredFiles

    if not Path("/proc/net/tcp").exists():
        pytest.skip("needs Linux /proc")
    (tmp_path / "old.txt").write_text("written before the tenant ran")
    since = time.time() + 0.01
    time.sleep(0.05)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = (
        "import http.server, pathlib, time\n"
        "pathlib.Path('store.db').write_text('x'); pathlib.Path('store.db-wal').write_text('x')\n"
        "held = open('notes.txt', 'w'); held.write('kept open'); held.flush()\n"
        "pathlib.Path('cache.pkl').write_bytes(b'cached')\n"
        "print('ready', flush=True)\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), http.server.BaseHTTPRequestHandler).serve_forever()\n"
    )
    with open(tmp_path / "agent.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while "ready" not in (tmp_path / "agent.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.3)  # listening
        look = UndeclaredFiles.of(f"http://127.0.0.1:{port}")
        assert look is not None and proc.pid in look.pids and look.uid == os.getuid()
        found = {Path(f).name for f in look.find([str(tmp_path / "store.db")], since)}
        assert found == {"notes.txt", "cache.pkl"}, found
        assert UndeclaredFiles.of("tests.sqlite_agent:plain") is None  # in-process: nothing to tell apart
    finally:
        proc.kill()
        proc.wait()


def _vec0_sqlite() -> list[str]:
    """A sqlite3 shell that loads sqlite-vec's real extension (the package's vec0.so), or [] where this
    machine has none (the test is then skipped, saying why)."""
    import shutil

    sqlite_vec = pytest.importorskip("sqlite_vec")
    shell = shutil.which("sqlite3")
    if shell is None:
        pytest.skip("no sqlite3 shell to load sqlite-vec's extension with (this Python cannot load one)")
    return [shell, "-cmd", f".load {str(sqlite_vec.loadable_path()).removesuffix('.so')}"]


def _vec0_db(tmp_path: Path, sql: str) -> Path:
    import subprocess

    db = tmp_path / "memories.sqlite"
    subprocess.run([*_vec0_sqlite(), str(db), sql], check=True, capture_output=True)
    return db


#: a fixed embedder for the mechanics: z's texts embed to Z_VEC, every other text elsewhere
Z_VEC, OTHER_VEC = [0.9, 0.1, 0.3, 0.2], [0.0, 1.0, 0.0, 0.0]


def _embed(texts: object) -> list[list[float]]:
    return [Z_VEC for _ in texts]  # type: ignore[attr-defined]


def test_an_embedding_of_z_in_a_sqlite_vec_table_is_found_in_its_chunk_not_left_unread(
    tmp_path: Path,
) -> None:
    db = _vec0_db(
        tmp_path,
        "CREATE VIRTUAL TABLE mem_vec USING vec0(embedding float[4]);"
        f"INSERT INTO mem_vec(rowid, embedding) VALUES (1, '{OTHER_VEC}'), (2, '{Z_VEC}');",
    )
    report = read_files([db], TargetMatcher.of("12 Linden Street"), embed=_embed)
    counts, examples, unread = report.counts()
    assert unread == {}, unread  # "no such module: vec0" left the whole file unread before
    assert counts["vectors"] == 1, examples
    assert "mem_vec_vector_chunks00.vectors" in examples["vectors"] and "slot 1" in examples["vectors"]
    assert "marked deleted" not in examples["vectors"]


def test_a_deleted_embedding_left_in_its_vector_chunk_is_found_and_one_zeroed_is_not(
    tmp_path: Path,
) -> None:
    made = (
        "CREATE VIRTUAL TABLE mem_vec USING vec0(embedding float[4]);"
        f"INSERT INTO mem_vec(rowid, embedding) VALUES (1, '{OTHER_VEC}'), (2, '{Z_VEC}');"
        "DELETE FROM mem_vec WHERE rowid = 2;"
    )
    # sqlite-vec as installed zeroes the deleted slot: nothing of z is left in the chunk
    clean = _vec0_db(tmp_path, made)
    counts, examples, unread = read_files(
        [clean], TargetMatcher.of("12 Linden Street"), embed=_embed
    ).counts()
    assert unread == {} and counts["vectors"] == 0, examples
    # releases before the fix cleared the validity bit and left the bytes: the slot put back as they left it
    import struct

    con = sqlite3.connect(clean)
    (blob,) = con.execute("SELECT vectors FROM mem_vec_vector_chunks00 WHERE rowid = 1").fetchone()
    blob = blob[:16] + struct.pack("<4f", *Z_VEC) + blob[32:]
    con.execute("UPDATE mem_vec_vector_chunks00 SET vectors = ? WHERE rowid = 1", (blob,))
    con.commit()
    con.close()
    counts, examples, _ = read_files([clean], TargetMatcher.of("12 Linden Street"), embed=_embed).counts()
    assert counts["vectors"] == 1, examples
    assert "slot 1, marked deleted" in examples["vectors"]
