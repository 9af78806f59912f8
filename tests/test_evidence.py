"""Evidence a privacy team can file: nothing the audit writes or prints holds the target unless asked, and a
signed forget receipt that standard DSSE tooling verifies, that `eu-audit verify` re-derives, and that
refuses a changed byte or a file that is not its subject. Scripted in-process agents (no model, seconds)."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path

import pytest

from eu_audit.bundle.io import read_bundle
from eu_audit.matching import TargetMatcher

from .helpers import run_cli

AGENT = "tests.scripted_agents:naive"  # deletes nothing: z is in its answers, its dump and the residue


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    folder = tmp_path_factory.mktemp("keys")
    k = Ed25519PrivateKey.generate()
    priv, pub = folder / "key.pem", folder / "key.pub.pem"
    priv.write_bytes(k.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()))
    pub.write_bytes(k.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ev") / "bb.jsonl"
    proc = run_cli("record", "--agent", AGENT, "--n", "2", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def variants(bundle: Path) -> set[str]:
    return {
        v
        for s in read_bundle(bundle).sessions
        for v in TargetMatcher.of(s.session.target.value, s.session.target.variants).variants
    }


def audit_into(folder: Path, bundle: Path, *extra: str) -> tuple[int, str]:
    folder.mkdir()
    proc = run_cli(
        "audit", str(bundle), "--json", str(folder / "audit.json"), "--junit", str(folder / "junit.xml"),
        "--rows", str(folder / "rows.parquet"), "--gate", "agent.residue_store==0",
        "--sarif", str(folder / "audit.sarif"), "--summary-md", str(folder / "summary.md"), *extra,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # the naive forget fails its residue fact
    report = run_cli("report", "--audit", str(folder / "audit.json"), "-o", str(folder / "report"))
    assert report.returncode == 0, report.stderr
    site = run_cli("view", str(folder / "audit.json"), "-o", str(folder / "site"))
    assert site.returncode == 0, site.stderr
    return proc.returncode, proc.stdout + proc.stderr


def test_nothing_the_audit_writes_or_prints_holds_the_target_unless_asked(
    bundle: Path, tmp_path: Path
) -> None:
    zs = variants(bundle)
    _, printed = audit_into(tmp_path / "masked", bundle)
    files = [f for f in (tmp_path / "masked").rglob("*") if f.is_file()]
    assert {f.name for f in files} >= {
        "audit.json", "junit.xml", "rows.parquet", "report.md", "audit.sarif", "summary.md", "index.html"
    }  # fmt: skip
    for f in files:
        data = f.read_bytes()
        assert not [z for z in zs if z.encode() in data], f
    assert not [z for z in zs if z in printed]
    assert "[z:" in (tmp_path / "masked" / "audit.json").read_text()  # where it stayed, masked
    md = (tmp_path / "masked" / "report" / "report.md").read_text()
    assert (
        "| `agent.residue_store==0` | failed |" in md and "GDPR art. 17(1) erasure" in md
    )  # the control map
    _, printed = audit_into(tmp_path / "revealed", bundle, "--reveal-target")
    revealed = tmp_path / "revealed"
    assert any(z in (revealed / "audit.json").read_text() for z in zs) and any(z in printed for z in zs)
    for name in ("audit.json", "junit.xml", "rows.parquet", "audit.sarif", "summary.md", "site/index.html"):
        assert (revealed / name).stat().st_mode & 0o777 == 0o600, name
    assert any(z in (revealed / "site" / "index.html").read_text() for z in zs)  # asked for: shown


def test_a_signed_receipt_verifies_and_refuses_a_changed_byte_or_another_bundle(
    bundle: Path, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    priv, pub = keys
    js, receipt = tmp_path / "audit.json", tmp_path / "receipt.json"
    proc = run_cli(
        "audit", str(bundle), "--json", str(js), "--gate", "agent.residue_store==0",
        "--gate", "agent.leak_probes<=floor", "--attest", str(receipt), "--signing-key", str(priv),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert not [z for z in variants(bundle) if z in receipt.read_text()]
    proc = run_cli("verify", str(receipt), str(js), str(bundle), "--key", str(pub))
    # a verified FAILED exits 1, so a CI step gating on verify fails with the forget
    assert proc.returncode == 1 and "follows from" in proc.stdout, proc.stdout + proc.stderr
    assert "does not prove" in proc.stdout and "proves:" not in proc.stdout  # "measured", for a FAILED
    assert "measured (the verdict is FAILED" in proc.stdout
    # only the audit JSON: refused (exit 2) unless --partial, which says what it did not check
    proc = run_cli("verify", str(receipt), str(js), "--key", str(pub))
    assert proc.returncode == 2 and "not every subject" in proc.stderr, proc.stdout + proc.stderr
    proc = run_cli("verify", str(receipt), str(js), "--key", str(pub), "--partial")
    assert proc.returncode == 1 and "bb.jsonl: NOT CHECKED" in proc.stdout, proc.stdout + proc.stderr
    # a junk signature under the signer's key id before a valid one by an attacker's key: the attacker's
    # signature does not verify under the signer's key, and the junk one is no signature at all
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from eu_audit.audits.evidence import sign

    attacker = tmp_path / "attacker.pem"
    attacker.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    signed = json.loads(receipt.read_text())
    forged = sign(json.loads(base64.b64decode(signed["payload"])), attacker)
    junk = {"keyid": signed["signatures"][0]["keyid"], "sig": "00" * 64}
    forged["signatures"] = [junk, *forged["signatures"]]
    spoof = tmp_path / "spoof.json"
    spoof.write_text(json.dumps(forged))
    proc = run_cli("verify", str(spoof), str(js), str(bundle), "--key", str(pub))
    assert proc.returncode == 2 and "no signature verifies" in proc.stderr, proc.stdout + proc.stderr
    # an independent reader: the DSSE library itself, and the statement's in-toto fields
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import SSlibKey

    env = json.loads(receipt.read_text())
    Envelope.from_dict(copy.deepcopy(env)).verify(
        [SSlibKey.from_crypto(load_pem_public_key(pub.read_bytes()))], 1
    )  # type: ignore[arg-type]
    stmt = json.loads(base64.b64decode(env["payload"]))
    assert stmt["_type"] == "https://in-toto.io/Statement/v1"
    assert stmt["predicateType"] == "https://in-toto.io/attestation/test-result/v0.1"
    assert stmt["predicate"]["result"] == "FAILED" and stmt["predicate"]["failedTests"] == [
        "agent.residue_store==0"
    ]
    # one byte of the predicate changed: the signature no longer verifies (exit 2)
    tampered = dict(
        env, payload=base64.b64encode(base64.b64decode(env["payload"]).replace(b"FAILED", b"PASSED")).decode()
    )
    bad = tmp_path / "tampered.json"
    bad.write_text(json.dumps(tampered))
    proc = run_cli("verify", str(bad), str(js), "--key", str(pub))
    assert proc.returncode == 2 and "signature" in proc.stderr
    # a bundle that is not its subject (exit 2)
    other = tmp_path / "other.jsonl"
    other.write_bytes(bundle.read_bytes() + b" ")  # one byte more: another file
    proc = run_cli("verify", str(receipt), str(js), str(other), "--key", str(pub))
    assert proc.returncode == 2 and "not a subject" in proc.stderr


def test_a_receipt_whose_verdict_does_not_follow_from_its_rows_does_not_verify(
    bundle: Path, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    from eu_audit.audits.evidence import sha256_file, sign, statement
    from eu_audit.audits.model import AuditReport

    priv, pub = keys
    js = tmp_path / "audit.json"
    assert (
        run_cli("audit", str(bundle), "--json", str(js), "--gate", "agent.residue_store==0").returncode == 1
    )
    rep = AuditReport.model_validate_json(js.read_bytes())
    stmt = statement(rep, [(bundle.name, sha256_file(bundle)), (js.name, sha256_file(js))], js.name, [])
    stmt["predicate"]["result"] = "PASSED"  # a signer who claims more than the rows show
    rules = stmt["predicate"]["configuration"][0]["annotations"]["rules"]
    rules[0]["outcome"] = "held"
    receipt = tmp_path / "receipt.json"
    receipt.write_text(json.dumps(sign(stmt, priv)))
    proc = run_cli("verify", str(receipt), str(js), str(bundle), "--key", str(pub))
    assert proc.returncode == 2 and "does NOT follow" in proc.stdout, proc.stdout + proc.stderr


def test_receipt_mistakes_exit_2_before_any_model_runs(
    bundle: Path, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    priv, pub = keys
    js = str(tmp_path / "a.json")
    cases = [
        (["--attest", str(tmp_path / "r.json"), "--signing-key", str(priv)], "--json"),
        (["--json", js, "--attest", str(tmp_path / "r.json")], "--signing-key"),
        (
            [
                "--json",
                js,
                "--attest",
                str(tmp_path / "r.json"),
                "--signing-key",
                str(tmp_path / "nokey.pem"),
            ],
            "nokey.pem",
        ),
        (["--json", js, "--attest", str(tmp_path / "r.json"), "--signing-key", str(pub)], "private key"),
        (
            [
                "--json",
                js,
                "--attest",
                str(tmp_path / "r.json"),
                "--signing-key",
                str(priv),
                "--subject",
                str(tmp_path / "none"),
            ],
            "none",
        ),
    ]
    for extra, needle in cases:
        proc = run_cli("audit", str(bundle), *extra)
        assert proc.returncode == 2 and needle in proc.stderr, (extra, proc.stderr)
    not_a_receipt = tmp_path / "x.json"
    not_a_receipt.write_text('{"payloadType": "text/plain", "payload": "", "signatures": []}')
    proc = run_cli("verify", str(not_a_receipt), js, "--key", str(pub))
    assert proc.returncode == 2 and "payloadType" in proc.stderr


def test_unlearn_writes_a_signed_receipt_per_session_that_holds_no_target(
    tiny_bundle_for_receipts: Path, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    from securesystemslib.dsse import Envelope

    from eu_audit.audits.evidence import load_public_key

    priv, pub = keys
    folder = tmp_path / "receipts"
    proc = run_cli(
        "unlearn", "-m", "b0,b7", str(tiny_bundle_for_receipts), "-o", str(tmp_path / "out.jsonl"),
        "--attest", str(folder), "--signing-key", str(priv),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    receipts = sorted(folder.glob("*.receipt.json"))
    assert [r.name for r in receipts] == ["s0.b0.receipt.json", "s0.b7.receipt.json"]
    zs = variants(tiny_bundle_for_receipts)
    results = {}
    for r in receipts:
        assert not [z for z in zs if z in r.read_text()]
        env = json.loads(r.read_text())
        Envelope.from_dict(copy.deepcopy(env)).verify([load_public_key(pub)], 1)
        results[r.name] = json.loads(base64.b64decode(env["payload"]))["predicate"]["result"]
    assert results == {"s0.b0.receipt.json": "FAILED", "s0.b7.receipt.json": "PASSED"}
    out = tmp_path / "out.jsonl"
    proc = run_cli("verify", str(receipts[1]), str(out), str(tiny_bundle_for_receipts), "--key", str(pub))
    assert proc.returncode == 0 and "follows from session s0/b7" in proc.stdout, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def tiny_bundle_for_receipts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "t.jsonl"
    proc = run_cli("record", "--model", "tiny-random", "--engine", "hf", "--n", "1", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return out
