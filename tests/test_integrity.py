"""A bundle the tool accepts is a bundle it can trust: records are checked against each other and against
the model before anything runs, readers refuse what would crash or hang them, the model cache verifies
itself, and nothing a user typed or a killed run left behind corrupts an output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eu_audit.bundle.io import read_bundle
from eu_audit.engines.hf import HFEngine
from eu_audit.errors import BadInput
from eu_audit.jsonl import atomic_writer, interrupt_on_sigterm, parse_line, sweep_stale_temps
from eu_audit.models import FAST_MODEL, TINY_MODEL, LoadedModel, prepare, resolve_model
from eu_audit.record import RecordOptions, record

from .helpers import run_cli, stopped_by_sigterm

Lines = list[dict[str, Any]]


@pytest.fixture(scope="module")
def recorded(tiny: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("integrity") / "trace.jsonl"
    record(RecordOptions(model=TINY_MODEL, out=out, n=1), loaded=tiny)
    return out


def _lines(path: Path) -> Lines:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(lines: Lines, path: Path) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _first(lines: Lines, kind: str, pred: Callable[[dict[str, Any]], bool] = lambda x: True) -> int:
    return next(i for i, x in enumerate(lines) if x["type"] == kind and pred(x))


def _session(lines: Lines) -> dict[str, Any]:
    return lines[_first(lines, "session")]


def _resident_block(lines: Lines, i: int = 2) -> int:
    """The line of the i-th block that lives in the cache."""
    held = [k for k, x in enumerate(lines) if x["type"] == "block" and x["block"]["token_span"]]
    return held[i]


# --- every edit below looks consistent line by line; the records contradict each other -----------------


def _manifest_names_a_missing_block(lines: Lines) -> tuple[int, str]:
    _session(lines)["final_manifest"].append("b999")
    return _first(lines, "session"), "final_manifest"


def _manifest_skips_a_block(lines: Lines) -> tuple[int, str]:
    del _session(lines)["final_manifest"][1]
    return _first(lines, "session"), "final_manifest"


def _checkpoint_manifest_names_a_missing_block(lines: Lines) -> tuple[int, str]:
    i = _first(lines, "checkpoint", lambda x: bool(x["checkpoint"]["manifest"]))
    lines[i]["checkpoint"]["manifest"].append("b999")
    return i, "checkpoint.manifest"


def _ids_disagree_with_span(lines: Lines) -> tuple[int, str]:
    i = _resident_block(lines)
    lines[i]["block"]["token_ids"].pop()
    return i, "block.token_span"


def _checkpoint_offset_is_not_its_manifest(lines: Lines) -> tuple[int, str]:
    i = _first(lines, "checkpoint", lambda x: bool(x["checkpoint"]["manifest"]))
    lines[i]["checkpoint"]["token_offset"] += 1
    return i, "checkpoint.token_offset"


def _observation_points_nowhere(lines: Lines) -> tuple[int, str]:
    i = _first(lines, "observation")
    lines[i]["block_id"] = "b999"
    return i, "block_id"


def _tool_call_points_nowhere(lines: Lines) -> tuple[int, str]:
    i = _first(lines, "tool_call")
    lines[i]["block_id"] = "b999"
    return i, "block_id"


def _turn_after_the_end(lines: Lines) -> tuple[int, str]:
    i = _resident_block(lines)
    lines[i]["block"]["turn"] = _session(lines)["transitions"] + 3
    return i, "block.turn"


def _observation_before_the_start(lines: Lines) -> tuple[int, str]:
    i = _first(lines, "observation")
    lines[i]["t"] = -1
    return i, "t"


def _checkpoint_after_the_end(lines: Lines) -> tuple[int, str]:
    i = _first(lines, "checkpoint")
    lines[i]["checkpoint"]["boundary"] = _session(lines)["transitions"] + 1
    return i, "checkpoint.boundary"


@pytest.mark.parametrize(
    "edit",
    [
        _manifest_names_a_missing_block,
        _manifest_skips_a_block,
        _checkpoint_manifest_names_a_missing_block,
        _ids_disagree_with_span,
        _checkpoint_offset_is_not_its_manifest,
        _observation_points_nowhere,
        _tool_call_points_nowhere,
        _turn_after_the_end,
        _observation_before_the_start,
        _checkpoint_after_the_end,
    ],
)
def test_records_that_contradict_each_other_are_refused_naming_line_and_field(
    recorded: Path, tmp_path: Path, edit: Callable[[Lines], tuple[int, str]]
) -> None:
    lines = _lines(recorded)
    index, field = edit(lines)
    bad = _write(lines, tmp_path / "bad.jsonl")
    with pytest.raises(BadInput) as info:
        read_bundle(bad)
    assert f"{bad}:{index + 1}:" in str(info.value) and f"field '{field}'" in str(info.value)


def test_the_target_is_stored_once_and_a_trace_1_bundle_still_reads_unless_its_copy_differs(
    recorded: Path, tmp_path: Path
) -> None:
    """A session line holds z once, in its episode. A trace@1 bundle (which kept a copy beside the
    episode's) reads as before; a copy that differs from the episode's is refused with its line."""
    lines = _lines(recorded)
    session = _session(lines)
    assert "target" not in session and session["episode"]["target"]["value"]
    old = [dict(x) for x in lines]
    old[0]["schema_version"] = "eu-audit/trace@1"
    i = _first(old, "session")
    old[i]["target"] = dict(session["episode"]["target"])
    del old[i]["index"]  # trace@1 had no number field: it is read from the id
    b = read_bundle(_write(old, tmp_path / "v1.jsonl"))
    assert b.sessions[0].session.index == session["index"] == 0
    # a line made today carries its number as written: an id is never parsed back into one
    from eu_audit.trace.records import SessionRecord

    assert SessionRecord.model_validate({k: v for k, v in session.items() if k != "index"}).index is None
    assert b.header.schema_version == "eu-audit/trace@2"
    assert b.sessions[0].session.target.value == session["episode"]["target"]["value"]
    old[i]["target"] = {**old[i]["target"], "value": "Quay Street 99, Dunedin"}
    with pytest.raises(BadInput) as info:
        read_bundle(_write(old, tmp_path / "v1-edited.jsonl"))
    assert f"v1-edited.jsonl:{i + 1}:" in str(info.value) and "differs from its episode's" in str(info.value)


def test_unlearn_refuses_a_block_whose_text_lost_the_target_while_its_ids_kept_it(
    recorded: Path, tmp_path: Path
) -> None:
    lines = _lines(recorded)
    target = _session(lines)["episode"]["target"]["value"]
    i = _first(lines, "block", lambda x: target in x["block"]["text"])
    lines[i]["block"]["text"] = lines[i]["block"]["text"].replace(target, "")
    bad = _write(lines, tmp_path / "edited.jsonl")
    read_bundle(bad)  # line by line and record by record it looks fine: only the tokenizer can tell
    proc = run_cli("unlearn", "-m", "b7", str(bad), "-o", str(tmp_path / "out.jsonl"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"edited.jsonl:{i + 1}" in proc.stderr and "block.text" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out.jsonl").exists()


def test_a_token_id_outside_the_vocabulary_is_refused_before_any_model_runs(
    recorded: Path, tmp_path: Path
) -> None:
    lines = _lines(recorded)
    i = _resident_block(lines)
    lines[i]["block"]["token_ids"][0] = 10**9
    proc = run_cli(
        "unlearn", "-m", "b7", str(_write(lines, tmp_path / "v.jsonl")), "-o", str(tmp_path / "o.jsonl")
    )
    assert proc.returncode == 2 and f"v.jsonl:{i + 1}" in proc.stderr and "vocabulary" in proc.stderr


def test_a_bundle_recorded_under_another_chat_template_is_refused(recorded: Path, tmp_path: Path) -> None:
    lines = _lines(recorded)
    lines[0]["model"]["chat_template_digest"] = "0" * 64
    proc = run_cli(
        "unlearn", "-m", "b7", str(_write(lines, tmp_path / "t.jsonl")), "-o", str(tmp_path / "o.jsonl")
    )
    assert proc.returncode == 2 and "model.chat_template_digest" in proc.stderr


# --- readers: bounded, regular files only, nothing that crashes later ----------------------------------


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b'{"a": ' + b"[" * 2000 + b"]" * 2000 + b"}\n", "nested"),
        (b'{"seed": 1' + b"7" * 5000 + b"}\n", "number too large"),
        (b'{"temperature": NaN}\n', "NaN"),
        (b'{"text": "\\ud800 lone"}\n', "surrogate"),
    ],
)
def test_a_line_that_would_crash_a_later_step_is_refused_where_it_is_read(raw: bytes, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_line(raw)


def test_a_surrogate_pair_written_as_escapes_is_a_valid_character() -> None:
    assert parse_line(b'{"t": "\\ud83d\\ude00"}\n') == {"t": "\N{GRINNING FACE}"}


def test_a_fifo_a_folder_and_an_oversized_file_are_refused_up_front(recorded: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    t0 = time.perf_counter()
    proc = run_cli("inspect", str(fifo))
    assert proc.returncode == 2 and "FIFO" in proc.stderr and time.perf_counter() - t0 < 60
    proc = run_cli("inspect", str(tmp_path))
    assert proc.returncode == 2 and "directory" in proc.stderr
    env = dict(os.environ, EU_AUDIT_MAX_INPUT_MB="0", COLUMNS="200")
    proc = subprocess.run(
        [sys.executable, "-m", "eu_audit.cli", "inspect", str(recorded)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "EU_AUDIT_MAX_INPUT_MB" in proc.stderr


def test_a_deeply_nested_bundle_line_exits_2_naming_the_line(recorded: Path, tmp_path: Path) -> None:
    lines = recorded.read_text().splitlines(keepends=True)
    lines[1] = lines[1][:-2] + ', "x": ' + "[" * 3000 + "]" * 3000 + "}\n"
    bad = tmp_path / "deep.jsonl"
    bad.write_text("".join(lines))
    proc = run_cli("inspect", str(bad))
    assert proc.returncode == 2 and "deep.jsonl:2" in proc.stderr and "Traceback" not in proc.stderr


# --- user text is printed, never interpreted -----------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "missing[/]file.jsonl"],
        ["inspect", "{bundle}", "--session", "[/]s0"],
        ["audit", "{bundle}", "--gate", "b7[/].leak_any<=floor"],
        ["unlearn", "-m", "[/bold]b7", "{bundle}"],
    ],
)
def test_markup_in_user_text_is_printed_literally_not_interpreted(recorded: Path, argv: list[str]) -> None:
    proc = run_cli(*[a.replace("{bundle}", str(recorded)) for a in argv])
    assert proc.returncode == 2, proc.stderr
    assert "[/" in proc.stderr and "MarkupError" not in proc.stderr and "Traceback" not in proc.stderr


# --- outputs, episode files and options are checked before any model runs ------------------------------


def test_outputs_that_could_not_be_written_are_refused_before_the_work(
    recorded: Path, tmp_path: Path
) -> None:
    a_file = tmp_path / "plain"
    a_file.write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    for out, needle in ((a_file / "out.jsonl", "is a file"), (tmp_path, "directory")):
        proc = run_cli("unlearn", "-m", "b7", str(recorded), "-o", str(out))
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    if os.geteuid() != 0:  # root writes anywhere
        proc = run_cli("unlearn", "-m", "b7", str(recorded), "-o", str(locked / "out.jsonl"))
        assert proc.returncode == 2 and "not writable" in proc.stderr


def test_a_recording_is_planned_once_and_both_sides_refuse_what_it_cannot_write_before_anything_runs(
    tmp_path: Path,
) -> None:
    """The white box and a deployed agent are planned by one ``RunPlan``: a state folder that is a file, an
    output that exists (no --force) and a shard with no session are refused with exit 2 before any model
    loads or any agent is called (the agent's URL here answers nothing)."""
    a_file = tmp_path / "plain"
    a_file.write_text("x")
    kept = tmp_path / "kept.jsonl"
    kept.write_text("mine")
    nobody = ["--agent", "http://127.0.0.1:9", "--serve", "http://127.0.0.1:9"]
    cases = [
        (["--state-dir", str(a_file), "-o", str(tmp_path / "t.jsonl")], "state folder is a file"),
        (["-o", str(kept)], "exists; pass --force"),
        (["--n", "1", "--shard", "2/2", "-o", str(tmp_path / "t.jsonl")], "no session of the 1"),
    ]
    for side in ([], nobody):
        for args, needle in cases:
            proc = run_cli("record", "--suite", "builtin", *side, *args)
            assert proc.returncode == 2 and needle in proc.stderr, (side, args, proc.stderr)
            assert "Traceback" not in proc.stderr
    assert kept.read_text() == "mine"  # the input is never touched


def _episode_line(builtin_line: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> str:
    ep = json.loads(json.dumps(builtin_line))
    change(ep)
    return json.dumps(ep) + "\n"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda ep: ep["steps"].__setitem__(0, {"kind": "tool", "tool": "launch_rocket"}), "steps.0.tool"),
        (lambda ep: ep.__setitem__("env", {"payees": 5}), "env.payees"),
        (lambda ep: ep["steps"][0].__setitem__("max_tokens", 100000), "steps.0.max_tokens"),
        (lambda ep: ep.__setitem__("toolset", "nowhere"), "toolset"),
    ],
)
def test_an_episode_that_would_fail_mid_run_is_refused_at_load_with_file_and_line(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], field: str
) -> None:
    from eu_audit.suites import data_dir

    first = json.loads((data_dir("suites") / "builtin.jsonl").read_text().splitlines()[0])
    suite = tmp_path / "eps.jsonl"
    suite.write_text(json.dumps(first) + "\n" + _episode_line(first | {"id": "second"}, change))
    proc = run_cli("record", "--suite", str(suite), "--model", TINY_MODEL, "--out", str(tmp_path / "t.jsonl"))
    assert proc.returncode == 2, proc.stderr
    assert (
        "eps.jsonl:2" in proc.stderr and f"field '{field}'" in proc.stderr and "Traceback" not in proc.stderr
    )


def test_a_nan_temperature_is_refused_before_recording(tmp_path: Path) -> None:
    proc = run_cli(
        "record", "--model", TINY_MODEL, "--temperature", "nan", "--out", str(tmp_path / "t.jsonl")
    )
    assert proc.returncode == 2 and "temperature" in proc.stderr


# --- nothing is lost: --force, temp files, the model cache ---------------------------------------------


def test_force_on_a_state_folder_removes_only_eu_audits_own_files(tiny: LoadedModel, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    mine = state / "notes.txt"
    mine.write_text("the user's own file")
    opts = RecordOptions(model=TINY_MODEL, out=tmp_path / "a.jsonl", n=1, state_dir=state)
    record(opts, loaded=tiny)
    with pytest.raises(BadInput, match="--force"):
        record(RecordOptions(model=TINY_MODEL, out=tmp_path / "b.jsonl", n=1, state_dir=state), loaded=tiny)
    record(
        RecordOptions(model=TINY_MODEL, out=tmp_path / "b.jsonl", n=1, state_dir=state, force=True),
        loaded=tiny,
    )
    assert mine.read_text() == "the user's own file" and (state / "memory.sqlite").exists()


def test_an_interrupted_write_leaves_no_temp_file_and_a_killed_writers_is_swept(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with pytest.raises(KeyboardInterrupt), atomic_writer(out) as f:
        f.write("half")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f".out.jsonl.{dead.stdout.strip()}.abc.eu-audit.tmp"
    stale.write_text("left by a killed run")
    sweep_stale_temps(out)
    assert not stale.exists()


def test_sigterm_unwinds_like_an_interrupt() -> None:
    before = signal.getsignal(signal.SIGTERM)
    try:
        interrupt_on_sigterm()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    finally:
        signal.signal(signal.SIGTERM, before)


#: how long the SIGTERM test lets record run: some of 40 sessions, not all
SESSIONS_S = 8


def test_record_stops_within_5_s_of_sigterm_exit_3_keeping_the_sessions_it_finished(tmp_path: Path) -> None:
    """A kill is never a success (typer returns 130 for it, which once left the CLI as exit 0), and the
    sessions recorded before it are a valid bundle whose header and audit say it was interrupted."""
    out = tmp_path / "b.jsonl"
    argv = [str(Path(sys.executable).parent / "eu-audit"), "record", "--model", TINY_MODEL, "--engine", "hf"]
    argv += ["--suite", "builtin", "--n", "40", "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    state = Path(str(out) + ".state")
    deadline = time.monotonic() + 120
    while not state.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)  # the model is loaded and the run has begun
    time.sleep(SESSIONS_S)  # a few of the tiny model's sessions (about 2 s each)
    assert proc.poll() is None, proc.communicate()
    took, said = stopped_by_sigterm(proc, timeout=30)
    assert proc.returncode == 3 and took < 5, (proc.returncode, took, said[-1500:])
    assert "interrupted after" in said, said[-1500:]
    bundle = read_bundle(out)  # valid: every line read and checked
    assert bundle.sessions and len(bundle.sessions) < 40
    assert bundle.header.engine_facts["interrupted"].startswith(f"after {len(bundle.sessions)} of 40")
    assert out.stat().st_mode & 0o777 == 0o600


def test_an_altered_or_truncated_model_cache_is_rebuilt_never_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EU_AUDIT_CACHE", str(tmp_path))
    spec = resolve_model(TINY_MODEL)
    folder = prepare(spec)
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    flipped = bytearray(good)
    flipped[-100] ^= 0xFF
    weights.write_bytes(bytes(flipped))
    assert prepare(spec) == folder and weights.read_bytes() == good  # made again from the source
    weights.write_bytes(good[: len(good) // 2])
    assert prepare(spec) == folder and weights.read_bytes() == good

    def models_verify() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "eu_audit.cli", "models", "--verify"],
            capture_output=True, text=True, env=dict(os.environ, EU_AUDIT_CACHE=str(tmp_path), COLUMNS="200"),
            timeout=300,
        )  # fmt: skip

    assert models_verify().returncode == 0
    # bytes flipped with the modification time kept: caught on the next load and by models --verify
    before = weights.stat()
    weights.write_bytes(bytes(flipped))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    proc = models_verify()
    assert proc.returncode == 1 and "model.safetensors" in proc.stderr, proc.stdout + proc.stderr
    assert prepare(spec) == folder and weights.read_bytes() == good
    assert models_verify().returncode == 0


def test_a_rewritten_cache_marker_cannot_make_altered_weights_load_under_the_pinned_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anyone who can write the cache can rewrite its marker too. SmolLM2's joined GGUF with one byte
    flipped and the marker rewritten to the altered file's sha256: the load checks the file against the
    digest the registry pins in code, finds it altered and joins it again; models --verify names the pin."""
    import json

    from eu_audit.models.cache import MARKER, sha256_of

    monkeypatch.setenv("EU_AUDIT_CACHE", str(tmp_path))
    spec = resolve_model(FAST_MODEL)
    folder = prepare(spec, "gguf")
    gguf = folder / "model.gguf"
    good = sha256_of(gguf)
    with open(gguf, "r+b") as f:
        f.seek(-4096, os.SEEK_END)
        byte = f.read(1)
        f.seek(-4096, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    marker = json.loads((folder / MARKER).read_text())
    marker["files"]["model.gguf"]["sha256"] = sha256_of(gguf)  # the attacker's own digest
    (folder / MARKER).write_text(json.dumps(marker))
    proc = subprocess.run(
        [sys.executable, "-m", "eu_audit.cli", "models", "--verify"],
        capture_output=True, text=True, env=dict(os.environ, EU_AUDIT_CACHE=str(tmp_path), COLUMNS="200"),
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1 and "the registry pins" in proc.stderr, proc.stdout + proc.stderr
    assert "smollm2-135m gguf: checked against the registry's pinned sha256 (model.gguf)" in proc.stdout
    assert prepare(spec, "gguf") == folder and sha256_of(gguf) == good == spec.source.sha256  # type: ignore[union-attr]


# --- fuzz: every mutated input is refused with its line, or accepted and processed ----------------------

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import fuzz  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@pytest.fixture(scope="module")
def tiny_engine(tiny: LoadedModel) -> HFEngine:
    return HFEngine(tiny)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_a_mutated_bundle_is_refused_with_its_line_or_processed_without_a_crash(
    recorded: Path, tiny_engine: HFEngine, seed: int
) -> None:
    t = fuzz.fuzz(recorded, "bundle", 1, seed, engine=tiny_engine, limit=30)
    assert not t.crashes and not t.unplaced, t.crashes + t.unplaced


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_mutated_episode_file_is_refused_with_its_line_or_processed_without_a_crash(seed: int) -> None:
    from eu_audit.suites import data_dir

    t = fuzz.fuzz(data_dir("suites") / "builtin.jsonl", "episodes", 1, seed, limit=30)
    assert not t.crashes and not t.unplaced, t.crashes + t.unplaced


def test_a_bundle_that_contradicts_itself_is_refused_and_never_gets_a_receipt(
    tiny: LoadedModel, tiny_engine: HFEngine, tmp_path: Path
) -> None:
    two = tmp_path / "two.jsonl"
    record(RecordOptions(model=TINY_MODEL, out=two, n=2), loaded=tiny)
    got = fuzz.semantic(two, tiny_engine, tmp_path)
    assert set(got) == {*fuzz.SEMANTIC_EDITS, "raw bytes that are not UTF-8 in a text"}  # every edit applied
    assert all(outcome.startswith("refused") for outcome in got.values()), got
