"""Evidence a privacy team can file: outputs that never contain the target, and a signed forget receipt.

- **Masking.** Everything meant to leave the machine (audit JSON, JUnit, Markdown, the printed summary,
  Parquet rows) shows each place z stayed with z replaced by ``[z:DIGEST]``: the first 12 hex digits of
  sha256(salt + the matched text), so two reports can be compared without either holding z. The salt is
  random, kept beside the bundle (``<bundle>.salt``, 0600); ``--reveal-target`` keeps the text for a
  local investigation (files then 0600).
- **The receipt** is an in-toto Statement (v1) with the test-result predicate
  (``https://in-toto.io/attestation/test-result/v0.1``) in a DSSE envelope signed with the user's
  ed25519 key (securesystemslib, the library in-toto itself uses). Subjects: the digests of the bundle,
  the masked audit JSON, the model weights and any ``--subject`` (the agent build). The predicate holds
  the result (PASSED / FAILED / WARNED for inconclusive), each rule with its outcome, n, p, bound and
  test, and what the run measured (a control map), never z.
- **verify** checks the signature, the subjects' digests against the files given, and that the verdicts
  follow from the audit rows the receipt names (recomputed), and says what the receipt does not prove.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eu_audit import __version__
from eu_audit.audits.model import AuditReport, read_report
from eu_audit.errors import BadInput
from eu_audit.matching import TargetMatcher

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://in-toto.io/attestation/test-result/v0.1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"


def result_of(outcomes: Iterable[str]) -> str:
    """The receipt's result: FAILED if a rule failed, WARNED if one is inconclusive or insensitive (a
    hold its positive control cannot back), PASSED only when every rule held."""
    seen = set(outcomes)
    return "FAILED" if "failed" in seen else "WARNED" if seen - {"held"} else "PASSED"


STATE_SEARCHED = (
    "GDPR art. 17(1) erasure: the post-forget state was searched for z (context, memory, pending tool "
    "calls); committed calls are side effects outside any replay"
)
RECORD_KEEPING = [
    "GDPR art. 5(2) accountability: this receipt records what was measured, on which artifacts, with "
    "what result",
    "EU AI Act art. 12 record keeping: the run's bundle and serve log (kept locally, 0600) are the event "
    "records",
    "ISO/IEC 42001 A.6.2.8 event logs: every model call of the run is logged by eu-audit serve",
]


# -- masking ---------------------------------------------------------------------------------------------


def salt_beside(bundle: Path) -> bytes:
    """The salt of a bundle's digests, made once (random, 0600) and kept beside it."""
    path = bundle.with_name(bundle.name + ".salt")
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        raise BadInput("unreadable salt file; remove it to make a new one", path=str(path)) from None
    salt = secrets.token_bytes(16)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(salt.hex() + "\n")
    return salt


@dataclass(frozen=True)
class Mask:
    """Replaces every variant of every target with ``[z:DIGEST]`` (a salted digest of the matched span)."""

    matchers: tuple[TargetMatcher, ...]
    salt: bytes

    def digest(self, span: str) -> str:
        return hashlib.sha256(self.salt + span.encode()).hexdigest()[:12]

    def text(self, s: str) -> str:
        for m in self.matchers:
            s = m.redact(s, lambda span: f"[z:{self.digest(span)}]")
        return s

    def value(self, obj: Any) -> Any:
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, list):
            return [self.value(x) for x in obj]
        if isinstance(obj, dict):
            return {k: self.value(v) for k, v in obj.items()}
        return obj

    def report(self, rep: AuditReport) -> AuditReport:
        return AuditReport.model_validate(self.value(rep.model_dump(mode="json")))

    def variant_digests(self) -> list[str]:
        return sorted({self.digest(v) for m in self.matchers for v in m.variants})


def mask_for(bundle_path: Path) -> Mask:
    """Every target of the bundle (its sessions' targets and variants), salted beside it."""
    from eu_audit.bundle.io import read_bundle

    bundle = read_bundle(bundle_path)
    targets = {(s.session.target.value, tuple(s.session.target.variants)) for s in bundle.sessions}
    return Mask(tuple(TargetMatcher.of(v, vs) for v, vs in sorted(targets)), salt_beside(bundle_path))


# -- the receipt -----------------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError as exc:
        raise BadInput(f"cannot read the subject: {exc.strerror}", path=str(path)) from None
    return h.hexdigest()


def load_signer(key: Path) -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner

    try:
        private = load_pem_private_key(key.read_bytes(), password=None)
    except OSError as exc:
        raise BadInput(f"cannot read the signing key: {exc.strerror}", path=str(key)) from None
    except (ValueError, TypeError) as exc:
        raise BadInput(f"not an unencrypted PEM private key ({exc})", path=str(key)) from None
    if not isinstance(private, Ed25519PrivateKey):
        raise BadInput("the signing key must be ed25519", path=str(key))
    return CryptoSigner(private)


def load_public_key(key: Path) -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from securesystemslib.signer import SSlibKey

    try:
        public = load_pem_public_key(key.read_bytes())
    except OSError as exc:
        raise BadInput(f"cannot read the public key: {exc.strerror}", path=str(key)) from None
    except ValueError as exc:
        raise BadInput(f"not a PEM public key ({exc})", path=str(key)) from None
    if not isinstance(public, Ed25519PublicKey):
        raise BadInput("the public key must be ed25519", path=str(key))
    return SSlibKey.from_crypto(public)


def statement(
    report: AuditReport, subjects: Sequence[tuple[str, str]], audit_name: str, variant_digests: list[str]
) -> dict[str, Any]:
    """The in-toto Statement: subjects (name, sha256) and the test-result predicate of the gates."""
    from eu_audit.audits.gate import gate_results

    verdicts = gate_results(report)
    outcomes = {g.outcome for g in verdicts}
    result = result_of(outcomes)
    rules = [g.model_dump(mode="json", exclude={"held"}) for g in verdicts]
    controls = controls_for([g.rule for g in verdicts])
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": n, "digest": {"sha256": d}} for n, d in subjects],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "result": result,
            "passedTests": [g.rule for g in verdicts if g.outcome == "held"],
            "warnedTests": [g.rule for g in verdicts if g.outcome == "inconclusive"],
            #: held nowhere their positive control showed z: counted apart, never passed
            "insensitiveTests": [g.rule for g in verdicts if g.outcome == "insensitive"],
            "failedTests": [g.rule for g in verdicts if g.outcome == "failed"],
            "configuration": [
                {
                    "name": audit_name,
                    "digest": {"sha256": subjects[1][1]},
                    "annotations": {
                        "tool": f"eu-audit {__version__}",
                        "model": report.model,
                        "model_digest": report.model_digest,
                        "engine": report.engine,
                        "methods": report.methods,
                        "suites": report.suites,
                        "sessions": len({s.session_id for s in report.states}),
                        "margin": report.margin,
                        "alpha": report.alpha,
                        "rules": rules,
                        "controls_measured": controls,
                        "target_variant_digests": variant_digests,
                        "forget_hint": report.engine_facts.get("forget_hint"),
                        # what was not eu-audit's own (only where a plug-in was loaded: older receipts
                        # verify unchanged)
                        **({"plugins": report.plugins} if report.plugins else {}),
                        **({"defined_by": report.defined_by} if report.defined_by else {}),
                    },
                }
            ],
        },
    }


def forget_statement(
    session_id: str, method: str, ledger: Any, receipt: Any, subjects: Sequence[tuple[str, str]], mask: Mask
) -> dict[str, Any]:
    """One session's white-box forget receipt as a Statement: PASSED when the post-forget state holds z
    nowhere (context, memory, pending calls), with the recompute ledger and where z was left (no z)."""
    test = f"{session_id}/{method}: z absent from context, memory and pending tool calls"
    left = [o.model_dump(mode="json") for o in receipt.occurrences]
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": n, "digest": {"sha256": d}} for n, d in subjects],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "result": "PASSED" if receipt.clean else "FAILED",
            "passedTests": [test] if receipt.clean else [],
            "warnedTests": [],
            "failedTests": [] if receipt.clean else [test],
            "configuration": [
                {
                    "name": subjects[-1][0],
                    "digest": {"sha256": subjects[-1][1]},
                    "annotations": {
                        "tool": f"eu-audit {__version__}",
                        "method": method,
                        "tau": ledger.tau,
                        "transitions_replayed": ledger.transitions_replayed,
                        "tokens_prefilled": ledger.tokens_prefilled,
                        "tokens_decoded": ledger.tokens_decoded,
                        "tokens_reused": ledger.tokens_reused,
                        "left_behind": left,
                        "target_variant_digests": mask.variant_digests(),
                        "controls_measured": [STATE_SEARCHED, *RECORD_KEEPING],
                    },
                }
            ],
        },
    }


def controls_for(rules: Sequence[str]) -> list[str]:
    """The obligations the rules' measurements speak to, then what any recorded run keeps."""
    from eu_audit.audits.gate import parse_rule

    metrics = set()
    for r in rules:
        try:
            metrics.add(parse_rule(r).metric)
        except BadInput:  # the errored-states pseudo-rule
            continue
    from eu_audit.audits.metric import METRICS

    return [c for m in sorted(metrics) if m in METRICS for c in METRICS.get(m).receipt] + RECORD_KEEPING


def sign(stmt: dict[str, Any], key: Path) -> dict[str, Any]:
    from securesystemslib.dsse import Envelope

    env = Envelope(json.dumps(stmt, sort_keys=True).encode(), PAYLOAD_TYPE, {})
    env.sign(load_signer(key))
    return dict(env.to_dict())


# -- verification ----------------------------------------------------------------------------------------


@dataclass
class Verification:
    valid: bool  # the signature and every subject digest check
    follows: bool  # the verdicts follow from the audit rows
    lines: list[str]
    result: str = ""  # the verdict verified: PASSED, FAILED or WARNED

    @property
    def exit_code(self) -> int:
        """0 a verified PASSED, 1 a verified FAILED, 4 a verified WARNED (inconclusive or insensitive);
        2 a receipt whose verdict does not follow from its rows (it does not verify)."""
        if not (self.valid and self.follows):
            return 2
        return {"PASSED": 0, "FAILED": 1}.get(self.result, 4)


def _verifying_key(env_dict: dict[str, Any], key: Any, receipt: Path) -> str:
    """The id of ``key`` when one of the envelope's signatures verifies under it. Each signature is tried
    alone, and the key's own id is named, never the id a signature claims: a junk signature under the
    signer's id beside a good one by another key proves nothing."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError

    sigs = env_dict.get("signatures")
    if not isinstance(sigs, list) or not sigs:
        raise BadInput("the envelope holds no signature", path=str(receipt), field="signatures")
    for sig in sigs:
        one = {**env_dict, "signatures": [sig]}
        try:
            env = Envelope.from_dict(copy.deepcopy(one))
            env.verify([key], 1)
        except VerificationError:
            continue
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise BadInput(f"malformed envelope ({exc})", path=str(receipt), field="signatures") from None
        return str(key.keyid)
    raise BadInput(
        f"no signature verifies with the given key (key {key.keyid}; the envelope's signatures claim "
        f"{', '.join(str(s.get('keyid', '?'))[:16] for s in sigs if isinstance(s, dict))})",
        path=str(receipt),
        field="signatures",
    )


def _pinned_digest(model: str) -> str | None:
    """The sha256 the model registry pins for a registered model's weights (None: not registered, or
    made locally, such as the tiny random model)."""
    from eu_audit.models import EmbeddedGGUF, resolve_model

    try:
        src = resolve_model(model).source
    except BadInput:
        return None
    return src.sha256 if isinstance(src, EmbeddedGGUF) else None


def _what_it_shows(result: str, controls: Sequence[str]) -> list[str]:
    """'proves' only for a PASSED verdict; a failed or warned one measured those things, and showed no
    more than its verdict says."""
    word = "proves" if result == "PASSED" else f"measured (the verdict is {result}, so it proves none of it)"
    return [f"{word}: {c}" for c in controls]


def read_envelope(path: Path) -> dict[str, Any]:
    try:
        env = json.loads(path.read_text())
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror}", path=str(path)) from None
    except ValueError:
        raise BadInput("not JSON; expected a DSSE envelope", path=str(path)) from None
    if not isinstance(env, dict) or env.get("payloadType") != PAYLOAD_TYPE or "signatures" not in env:
        raise BadInput(
            f"not a DSSE envelope of an in-toto statement (payloadType {PAYLOAD_TYPE})",
            path=str(path),
            field="payloadType",
        )
    return env


def verify_receipt(
    receipt: Path, public_key: Path, files: Sequence[Path], *, partial: bool = False
) -> Verification:
    """Signature, subjects (every one, unless ``partial``), and the verdicts recomputed from the audit JSON
    among ``files``."""
    from eu_audit.audits.gate import PSEUDO_RULES, default_rules, evaluate

    env_dict = read_envelope(receipt)
    key_used = _verifying_key(env_dict, load_public_key(public_key), receipt)
    stmt = json.loads(base64.b64decode(env_dict["payload"]))
    if stmt.get("_type") != STATEMENT_TYPE or stmt.get("predicateType") != PREDICATE_TYPE:
        raise BadInput(
            "not an in-toto Statement v1 with the test-result predicate",
            path=str(receipt),
            field="predicateType",
        )
    lines = [f"signature: valid (ed25519, verified with key {key_used})"]
    named = {subj["digest"]["sha256"]: subj["name"] for subj in stmt["subject"]}
    audit_name = stmt["predicate"]["configuration"][0]["name"]
    audit_file = None
    checked = set()
    for d, n in named.items():  # the weights by their registered name: the registry pins their digest
        if n.startswith("model-weights:") and _pinned_digest(n.split(":", 1)[1]) == d:
            checked.add(d)
            lines.append(f"subject {n}: matches the digest eu-audit's model registry pins for it")
    for f in files:  # every file given must be one of the receipt's subjects
        d = sha256_file(f)
        if d not in named:
            raise BadInput("is not a subject of this receipt (its sha256 matches none)", path=str(f))
        checked.add(d)
        lines.append(f"subject {named[d]}: matches {f}")
        audit_file = f if named[d] == audit_name else audit_file
    missing = [n for d, n in named.items() if d not in checked]
    if missing and not partial:
        raise BadInput(
            f"not every subject of the receipt was given: {', '.join(missing)}; give them all, or pass "
            "--partial to check only those given (what was not checked is printed)",
            path=str(receipt),
            field="subject",
        )
    lines += [f"subject {n}: NOT CHECKED (its file was not given; --partial)" for n in missing]
    if audit_file is None:
        raise BadInput(
            f"give the file the receipt's verdict is recomputed from ({audit_name})",
            path=str(receipt),
            field="subject",
        )
    annotations = stmt["predicate"]["configuration"][0]["annotations"]
    if "rules" not in annotations:  # a per-session receipt of unlearn: its state is in the output bundle
        return _verify_forget(stmt, audit_file, lines)
    report = read_report(audit_file)
    recorded = stmt["predicate"]["configuration"][0]["annotations"]["rules"]
    rules = [r["rule"] for r in recorded if r["rule"] not in PSEUDO_RULES]
    again = evaluate(report, rules or default_rules(report), alpha=report.alpha, margin=report.margin)
    got = {g.rule: g.outcome for g in again}
    follows = all(got.get(r["rule"]) == r["outcome"] for r in recorded if r["rule"] in got)
    predicate_result = stmt["predicate"]["result"]
    outcomes = set(got.values())
    expected = result_of(outcomes)
    follows = follows and expected == predicate_result
    lines.append(
        f"verdict: {predicate_result}, "
        + ("follows from" if follows else "does NOT follow from")
        + f" the {len(report.states)} audit rows of {audit_file} (recomputed)"
    )
    lines += _what_it_shows(predicate_result, annotations["controls_measured"])
    lines += [f"does not prove: {c}" for c in limits(report)]
    return Verification(True, follows, lines, predicate_result)


def limits(report: AuditReport) -> list[str]:
    """What a receipt of this audit does not show."""
    out = []
    if report.side == "black":
        out.append("that stores missing from the agent's dump are clean (residue_store searched the dump)")
        out.append(
            "that model calls bypassing eu-audit serve were clean (residue_context saw only the calls "
            "through serve)"
        )
        out.append(
            "that files the agent wrote outside its working directory and keeps closed are clean (eu-audit "
            "read the files it named, and on Linux those its processes held open or wrote under their "
            "working directory)"
        )
        undeclared = sorted({f for s in report.states if s.residue for f in s.residue.disk_undeclared})
        if undeclared:
            out.append(
                f"that the agent names every file it keeps: it did not name {', '.join(undeclared[:5])}"
            )
    out.append("that other targets, sessions or data than the audited ones were forgotten")
    n = len({s.session_id for s in report.states})
    out.append(f"anything beyond the {n} session(s) audited (see each rule's n and bound)")
    return out


def _verify_forget(stmt: dict[str, Any], out_bundle: Path, lines: list[str]) -> Verification:
    """An ``unlearn --attest`` receipt: the session's receipt in the output bundle says the same."""
    from eu_audit.bundle.io import read_bundle

    pred = stmt["predicate"]
    test = next(iter(pred["passedTests"] or pred["failedTests"]), "")
    sid = test.split(":")[0]
    trace = read_bundle(out_bundle).session(sid)
    clean = bool(trace.receipts) and trace.receipts[0].clean
    follows = pred["result"] == ("PASSED" if clean else "FAILED")
    lines.append(
        f"verdict: {pred['result']}, "
        + ("follows from" if follows else "does NOT follow from")
        + f" session {sid}'s receipt in {out_bundle} (re-read)"
    )
    lines += _what_it_shows(pred["result"], pred["configuration"][0]["annotations"]["controls_measured"])
    lines.append("does not prove: that the method's state equals a reference (audit it for that)")
    return Verification(True, follows, lines, pred["result"])
