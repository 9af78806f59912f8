"""The package's structure: no import cycles, the runtime apart from the file format, built-ins that load
through their registries, one matcher for every question about the target."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from eu_audit.matching import TargetMatcher

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import structure  # noqa: E402


def test_the_package_has_no_import_cycles_and_the_runtime_never_imports_the_file_format() -> None:
    graph = structure.import_graph(ROOT / "eu_audit")
    assert structure.cycles(graph) == []
    assert structure.forbidden_edges(graph) == []
    # the rules are live: the agent does depend on the domain records (the trace), not on the bundle
    assert "eu_audit.trace.records" in graph["eu_audit.runtime.agent"]


def test_the_shape_gets_no_worse_modules_type_only_cycles_and_names_defined_twice() -> None:
    """Ratchets at what 'python tools/structure.py' measured when they were set (lower them as the code
    improves, never raise them): no module over 600 lines; no cycle closed by a type-only import (the last,
    runtime.agent <-> runtime.resume, is a ``Resumable`` protocol now); public top-level names defined in
    more than one module (none: ``Progress``, once in six modules, is ``eu_audit.progress``; the trace's
    forget request is ``ForgetRequestRecord``, the contract's ``ForgetRequest``; the tool the harness
    offers is ``OfferedTool``, the runtime's ``ToolSpec``; a TypeVar is not counted)."""
    root = ROOT / "eu_audit"
    assert structure.module_lines(root).lines <= 600
    assert structure.cycles(structure.import_graph(root, type_only=True)) == []
    assert not structure.repeated_names(root)


def test_the_folders_form_layers_with_no_loop_between_them() -> None:
    """No two folders import each other, even through others, type-only imports counted: the data sets sit
    above the registries they fill, the models below the engines, the provenance graph inside the trace,
    and everything that measures and decides an audit in ``eu_audit.audits``, below its orchestrators."""
    graph = structure.import_graph(ROOT / "eu_audit", type_only=True)
    assert structure.cycles(structure.folder_graph(graph)) == []
    # the check is live: folders do import each other, in one direction
    folders = structure.folder_graph(graph)
    assert (
        "eu_audit.audits" in folders["eu_audit.blackbox"]
        and "eu_audit.engines" in folders["eu_audit.runtime"]
    )


def test_built_ins_load_through_their_registries_by_name() -> None:
    """A fresh interpreter that imports only the registries finds every built-in: no module has to be
    imported by hand (a new builder registers by being listed once, next to its registry)."""
    code = (
        "from eu_audit.suites.build import BUILDERS\n"
        "from eu_audit.suites import LOADERS\n"
        "from eu_audit.runtime.tools import TOOLSETS, TOOLS\n"
        "from eu_audit.methods import METHODS\n"
        "from eu_audit.audits.metrics import UTILITY_CHECKS\n"
        "from eu_audit.sweeps import SWEEPS\n"
        "print(BUILDERS.names(), LOADERS.names(), TOOLSETS.names(), METHODS.names(), "
        "UTILITY_CHECKS.names(), SWEEPS.names(), 'transfer' in TOOLS)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "['agentdojo', 'bfcl-memory', 'bfcl-tools', 'preference']" in out
    assert "['longmemeval']" in out
    assert "agentdojo-banking" in out and "'bfcl'" in out and "'builtin'" in out
    assert "'b7'" in out and "'excise'" in out
    assert "['agentdojo']" in out
    assert "'tau'" in out and out.strip().endswith("True")


def test_registry_kinds_are_identifiers_because_they_name_entry_point_groups() -> None:
    import pytest

    from eu_audit.registry import Registry

    with pytest.raises(ValueError, match="identifier"):
        Registry("suite builders")


def test_one_matcher_receipts_and_audits_agree_on_a_paraphrased_address() -> None:
    """'12 Linden St' is the address: the receipt, the sink policy, B6's redaction and the audit all see
    it, because they all ask the same matcher."""
    from eu_audit.trace.records import SinkPolicy

    m = TargetMatcher.of("12 Linden Street")
    text = "Pick-up: 12 Linden St. at 8"
    assert m.found_in(text)
    assert m.redact(text, "[REDACTED]") == "Pick-up: [REDACTED]. at 8"
    assert not m.found_in(m.redact(text, "[REDACTED]"))
    policy = SinkPolicy(blocked_values=["12 Linden Street"], identifier_args={"book_taxi": ["pickup"]})
    assert policy.blocks("book_taxi", {"pickup": "12 linden st"})


def test_an_address_with_joining_words_between_its_parts_is_still_the_address() -> None:
    """Seen in a real sample (Qwen2.5-Coder-0.5B, bfcl-tools): "456 Oakwood Avenue, Rivermist, and 83214".
    Every part in order with only joining words between is the target, for the audit and the mask alike;
    the parts apart, or a sentence between them, are not."""
    m = TargetMatcher.of("456 Oakwood Avenue, Rivermist, 83214")
    said = "This returned a list of 456 Oakwood Avenue, Rivermist, and 83214."
    assert m.found_in(said) and m.redact(said, "[z]") == "This returned a list of [z]."
    assert m.found_in("456 Oakwood Ave in Rivermist, zip code 83214")  # a street paraphrase, joined
    for apart in (
        "Rivermist",
        "456 Oakwood Avenue, Rivermist",
        "456 Oakwood Avenue is near Rivermist, 83214",
    ):
        assert not m.found_in(apart) and m.redact(apart, "[z]") == apart


def test_the_agent_is_split_and_no_class_dwarfs_the_rest() -> None:
    fn, body, cls = structure.largest(ROOT / "eu_audit")
    assert cls.lines <= 360, cls  # Agent
    assert fn.lines <= 111, fn  # cli.audit: a signature of options, one line each
    assert body.lines <= 82, body  # blackbox.agent_server's app (record_agent, 84, went to RunPlan)


def test_engine_abilities_are_read_by_name_nowhere() -> None:
    """An engine's abilities are typed attributes (``engine.abilities``); nothing probes an engine for a
    method or a field by name (``getattr(engine, "decode_branches")`` switched the audit silently)."""
    from eu_audit.engines.base import ABILITY_NAMES

    probed = {*ABILITY_NAMES, "decode_branches", "run_branches", "n_ctx", "n_ubatch", "n_vocab"}
    probed |= {"concurrent", "schedule", "slots", "reuse_reported", "kv_state", "last_logits"}
    found = []
    for path in sorted((ROOT / "eu_audit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in probed
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.args[1].value}")
    assert found == []


def test_a_metric_is_computed_by_its_own_object_and_nowhere_by_name() -> None:
    """Both sides score through ``audits.scoring`` with the computation each metric carries; the only
    values set by name are the two a state alone cannot give (Leak@probes over the probes the run keeps,
    and the serving pseudo-method's cache measurement)."""
    from eu_audit.audits.metric import METRICS

    names = set(METRICS.names())
    allowed = {("summary.py", "drop_probes"), ("audit.py", "serving_states")}
    found = []
    for path in sorted((ROOT / "eu_audit").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef) or (path.name, fn.name) in allowed:
                continue
            for node in ast.walk(fn):
                targets = node.targets if isinstance(node, ast.Assign) else []
                for t in targets:
                    keyed = (
                        isinstance(t, ast.Subscript)
                        and isinstance(t.value, ast.Attribute)
                        and t.value.attr == "values"
                        and isinstance(t.slice, ast.Constant)
                        and t.slice.value in names
                    )
                    literal = (
                        isinstance(t, ast.Attribute)
                        and t.attr == "values"
                        and isinstance(node.value, ast.Dict)  # type: ignore[union-attr]
                        and any(isinstance(k, ast.Constant) and k.value in names for k in node.value.keys)  # type: ignore[union-attr]
                    )
                    if keyed or literal:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} in {fn.name}")
    assert found == []


def test_each_data_set_module_is_named_once() -> None:
    """The data sets' plug-in modules are listed in one place (``eu_audit.plugins.BUILT_IN``); no registry
    names them again."""
    found = []
    for path in sorted((ROOT / "eu_audit").rglob("*.py")):
        if path == ROOT / "eu_audit" / "plugins.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and str(node.value).startswith("eu_audit.datasets."):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_no_code_compares_with_the_word_agent_it_names_the_side_or_the_tenant() -> None:
    """The word "agent" names two things in a bundle: the engine of a run made from outside
    (``BLACK_BOX_ENGINE``, read through ``Header.side``) and the forgetting tenant's method
    (``AGENT_METHOD``). Code compares with those names, never with the bare word, so a reader knows which
    one it means."""
    found = []
    for path in sorted((ROOT / "eu_audit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                isinstance(x, ast.Constant) and x.value == "agent" for x in (node.left, *node.comparators)
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
