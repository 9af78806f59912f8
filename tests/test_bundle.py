"""Trace bundle v1: round trip, byte-identical under a seed, and clear errors for bad files."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from eu_audit.bundle.io import read_bundle, write_bundle
from eu_audit.bundle.records import SCHEMA_VERSION, json_schema
from eu_audit.errors import BadInput
from eu_audit.models import LoadedModel
from eu_audit.record import RecordOptions, record


def _record(tiny: LoadedModel, out: Path, seed: int = 0, **kw: object) -> Path:
    record(RecordOptions(model="tiny-random", out=out, seed=seed, **kw), loaded=tiny)  # type: ignore[arg-type]
    return out


@pytest.fixture(scope="module")
def bundle_path(tiny: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tiny, tmp_path_factory.mktemp("rec") / "trace.jsonl")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_round_trip_reads_back_what_was_written_byte_for_byte(bundle_path: Path, tmp_path: Path) -> None:
    b = read_bundle(bundle_path)
    assert b.header.schema_version == SCHEMA_VERSION
    assert [s.session_id for s in b.sessions] == ["s0", "s1"]
    assert all(s.forget_requests and s.checkpoints and s.blocks for s in b.sessions)
    again = write_bundle(tmp_path / "again.jsonl", b.records())
    assert again.read_bytes() == bundle_path.read_bytes()


def test_the_same_seed_gives_a_byte_identical_bundle(
    tiny: LoadedModel, bundle_path: Path, tmp_path: Path
) -> None:
    second = _record(tiny, tmp_path / "second.jsonl")
    assert second.read_bytes() == bundle_path.read_bytes()


def test_a_sampled_run_depends_on_its_seed(tiny: LoadedModel, tmp_path: Path) -> None:
    a = _record(tiny, tmp_path / "a.jsonl", seed=1, temperature=0.9)
    b = _record(tiny, tmp_path / "b.jsonl", seed=1, temperature=0.9)
    c = _record(tiny, tmp_path / "c.jsonl", seed=2, temperature=0.9)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_bundles_and_state_are_private_files(bundle_path: Path) -> None:
    assert stat.S_IMODE(os.stat(bundle_path).st_mode) == 0o600
    state = bundle_path.with_name(bundle_path.name + ".state")
    for f in ("memory.sqlite", "outbox.sqlite"):
        assert stat.S_IMODE(os.stat(state / f).st_mode) == 0o600


def test_record_refuses_to_overwrite_without_force(tiny: LoadedModel, bundle_path: Path) -> None:
    before = _sha(bundle_path)
    with pytest.raises(BadInput, match="--force"):
        _record(tiny, bundle_path)
    assert _sha(bundle_path) == before


def test_kv_sidecar_is_safetensors(tiny: LoadedModel, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    out = _record(tiny, tmp_path / "kv.jsonl", kv_sidecar=True)
    header = read_bundle(out).header
    assert header.kv_sidecar == "kv.jsonl.kv.safetensors"
    tensors = load_file(str(tmp_path / header.kv_sidecar))
    assert "s0.layer0.keys" in tensors and tensors["s0.layer0.keys"].ndim == 3


def test_json_schema_describes_every_record_type() -> None:
    schema = json_schema()
    assert schema["$id"] == SCHEMA_VERSION
    assert set(schema["discriminator"]["mapping"]) == {
        "header",
        "session",
        "observation",
        "block",
        "tool_call",
        "checkpoint",
        "forget_request",
        "ledger",
        "receipt",
        "elicitation",
        "residue",
        "agent_forget",
        "end",
    }


# --- bad files: exit 2, the line named, the input untouched ----------------------------------------


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def _corrupt_json(lines: list[str]) -> tuple[list[str], int, str]:
    lines[5] = lines[5][: len(lines[5]) // 2] + "\n"
    return lines, 6, "not valid JSON"


def _truncated_mid_line(lines: list[str]) -> tuple[list[str], int, str]:
    lines = lines[:9]
    lines[-1] = lines[-1][:40]
    return lines, 9, "truncated"


def _truncated_at_a_line(lines: list[str]) -> tuple[list[str], int, str]:
    return lines[:12], 12, "truncated: no end record"


def _wrong_version(lines: list[str]) -> tuple[list[str], int, str]:
    head = json.loads(lines[0])
    head["schema_version"] = "eu-audit/trace@9"
    lines[0] = json.dumps(head) + "\n"
    return lines, 1, "unsupported schema version"


def _bad_field(lines: list[str]) -> tuple[list[str], int, str]:
    i = next(i for i, ln in enumerate(lines) if '"type":"block"' in ln)
    rec = json.loads(lines[i])
    rec["block"]["turn"] = "three"
    lines[i] = json.dumps(rec) + "\n"
    return lines, i + 1, "block.turn"


def _not_a_bundle(lines: list[str]) -> tuple[list[str], int, str]:
    return ['{"hello": 1}\n'], 1, "first line must be the bundle header"


@pytest.mark.parametrize(
    "damage",
    [_corrupt_json, _truncated_mid_line, _truncated_at_a_line, _wrong_version, _bad_field, _not_a_bundle],
)
def test_bad_bundles_exit_2_naming_the_line_and_leave_the_input_untouched(
    bundle_path: Path, tmp_path: Path, damage
) -> None:  # type: ignore[no-untyped-def]
    lines, line_no, needle = damage(_lines(bundle_path))
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(lines))
    before = _sha(bad)
    with pytest.raises(BadInput) as info:
        read_bundle(bad)
    assert f"{bad}:{line_no}" in str(info.value) and needle in str(info.value)
    proc = subprocess.run(
        [sys.executable, "-m", "eu_audit.cli", "inspect", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert f"bad.jsonl:{line_no}" in proc.stderr and "Traceback" not in proc.stderr
    assert _sha(bad) == before
