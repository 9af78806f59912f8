"""A plug-in package, installed as a user installs one (``examples/plugin``, pip), adds a metric, a gate
set and a data set without editing eu-audit; ``eu-audit plugins`` lists what it defines, an audit names it
with its version in the JSON and the receipt's annotations, its metric appears in every output a built-in
one does (the view, JUnit, SARIF, the job summary, the receipt, rescore), and ``EU_AUDIT_NO_PLUGINS=1``
runs without it."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eu_audit.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200", **env},
    )


def test_an_installed_plugin_is_listed_used_and_named_on_the_record_and_can_be_switched_off(
    tmp_path: Path,
) -> None:
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "--target", str(target), str(ROOT / "examples/plugin")], check=True, timeout=300)
    env = {"PYTHONPATH": os.pathsep.join([str(target), str(ROOT)])}
    listed = _cli("plugins", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "eu-audit-example-plugin==0.1.0" in listed.stdout
    for entry in ("metrics:z_words", "gate_sets:partial", "suites:example-one"):
        assert entry in listed.stdout, listed.stdout
    # its suite, its gate set and its metric in one gate run (a scripted agent: no model)
    out, js = tmp_path / "bb.jsonl", tmp_path / "audit.json"
    argv = ["gate", "--agent", "tests.scripted_agents:thorough", "--suite", "example-one", "--n", "1"]
    argv += ["--fixed-n", "--gate-set", "partial", "-o", str(out), "--json", str(js)]
    key = tmp_path / "key.pem"
    key.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()
        )
    )
    outputs = {name: tmp_path / name for name in ("junit.xml", "audit.sarif", "summary.md", "receipt.json")}
    more = ["--junit", str(outputs["junit.xml"]), "--sarif", str(outputs["audit.sarif"])]
    more += ["--summary-md", str(outputs["summary.md"]), "--attest", str(outputs["receipt.json"])]
    ran = _cli(*argv, *more, "--signing-key", str(key), env=env)
    assert ran.returncode in (0, 1, 4), ran.stdout + ran.stderr
    report = json.loads(js.read_text())
    assert report["plugins"] == ["eu-audit-example-plugin==0.1.0 (eu_audit.plugins: example)"]
    assert report["defined_by"]["metrics:z_words"] == "eu-audit-example-plugin==0.1.0"
    assert any(g["rule"] == "agent.z_words<=floor" for g in report["gates"]), report["gates"]
    assert any("z_words" in st["values"] for st in report["states"])
    assert "Plug-ins loaded: eu-audit-example-plugin==0.1.0" in ran.stdout
    # the view shows it beside each state's probes, as a built-in metric (Metric.per_state)
    site = tmp_path / "view"
    assert _cli("view", str(js), "-o", str(site), env=env).returncode == 0
    assert "z_words" in "".join(f.read_text() for f in site.rglob("*.html"))
    # every other output names it as it names a built-in metric: JUnit's test case, the job summary's row,
    # SARIF's rule with the metric's own description and the package that defined it, the signed receipt
    assert 'name="z_words"' in outputs["junit.xml"].read_text()
    assert "`agent.z_words<=floor`" in outputs["summary.md"].read_text()
    rules = json.loads(outputs["audit.sarif"].read_text())["runs"][0]["tool"]["driver"]["rules"]
    mine = next(r for r in rules if r["id"] == "agent.z_words<=floor")
    assert "target's words" in mine["fullDescription"]["text"]
    assert mine["properties"]["definedBy"] == "eu-audit-example-plugin==0.1.0"
    envelope = json.loads(outputs["receipt.json"].read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    annotations = statement["predicate"]["configuration"][0]["annotations"]
    assert annotations["defined_by"]["metrics:z_words"] == "eu-audit-example-plugin==0.1.0"
    assert any(r["rule"] == "agent.z_words<=floor" for r in annotations["rules"])
    # rescore decides it again from the JSON alone, as it does a built-in metric that reads answers
    rescored = tmp_path / "rescored.json"
    assert _cli("rescore", str(js), "-o", str(rescored), env=env).returncode == 0
    again = json.loads(rescored.read_text())
    assert any("z_words" in st["values"] for st in again["states"])
    assert any(g["rule"] == "agent.z_words<=floor" for g in again["gates"])
    # switched off: eu-audit's built-ins alone, and a run that needs the plug-in says what is missing
    off = _cli(*argv[:-4], "-o", str(tmp_path / "off.jsonl"), env={**env, "EU_AUDIT_NO_PLUGINS": "1"})
    assert off.returncode == 2 and "example-one" in off.stderr, off.stderr
