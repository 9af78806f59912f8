"""A README a newcomer finishes: at most 300 lines, its first two code blocks exactly what CI runs, every
page moved out of it one click away, every relative link in it and in docs/ resolving, and every docs page
with its own table of contents."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LINK = re.compile(r"\]\((?!https?:|mailto:)([^)#\s]+)(#[^)]*)?\)")


def _code_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_the_readme_is_short_and_starts_with_the_two_commands_ci_runs() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    install, tests = _code_blocks(text)[:2]
    ci = (ROOT / ".ci/run").read_text().replace(" -q ", " ")  # CI installs quietly, the same packages
    for part in install.split(" && "):
        assert part.strip() in ci, part
    assert tests in ci


def test_the_guides_contract_paragraph_names_every_route_the_contract_has() -> None:
    """docs/gate-your-agent.md's contract paragraph is what a user writes an agent from: every endpoint of
    the contract (eu_audit.blackbox.contract.ENDPOINTS) is named there, as the paragraph spells it."""
    from eu_audit.blackbox.contract import ENDPOINTS

    text = (ROOT / "docs" / "gate-your-agent.md").read_text()
    section = text.split("## The contract", 1)[1].split("\n## ", 1)[0]
    named = section.replace("{id}", "{session_id}")
    missing = [e.path for e in ENDPOINTS if e.path.lstrip("/").split("/{")[0] not in named]
    missing += [e.path for e in ENDPOINTS if e.path.count("/") > 1 and e.path.rsplit("/", 1)[1] not in named]
    assert not missing, missing


def test_every_relative_link_resolves_and_every_docs_page_is_one_click_from_the_readme() -> None:
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages
    readme = README.read_text()
    for page in pages:
        assert f"](docs/{page.name})" in readme, page.name
    for md in [README, *pages]:
        for target, _ in LINK.findall(md.read_text()):
            assert (md.parent / target).exists(), f"{md.name}: {target}"


def test_every_docs_page_has_a_table_of_contents_that_matches_its_headings() -> None:
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text()
        assert "Contents:" in text, page.name
        body = re.sub(r"```.*?```", "", text, flags=re.S)
        for heading in re.findall(r"^##+ (.+)$", body, flags=re.M):
            assert f"[{heading.replace('`', '')}](#" in text, f"{page.name}: {heading}"


def test_the_agents_table_is_what_the_committed_rows_say_and_no_cell_is_over_20_words() -> None:
    import subprocess
    import sys

    table = ROOT / "reports/agents/table.py"
    proc = subprocess.run(
        [sys.executable, str(table), "--check"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, "reports/agents/README.md's table differs from the rows: run table.py"
    text = (ROOT / "reports/agents/README.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    assert len(rows) > 10
    for row in rows:
        for cell in row.strip("|").split(" | "):
            words = re.sub(r"\]\([^)]*\)", "]", cell).split()  # a link's target is not read
            assert len(words) <= 20, cell
    for md in (ROOT / "reports/agents").glob("*.md"):
        for target, _ in LINK.findall(md.read_text()):
            assert (md.parent / target).exists(), f"{md.name}: {target}"


def test_every_registry_is_one_listed_extension_point_and_the_docs_table_is_made_from_the_list() -> None:
    from eu_audit.plugins import EXTENSION_POINTS, extension_points_table
    from eu_audit.registry import Registry

    defined = set()  # "module:NAME" of every module-level Registry in the package, found in the source
    for path in (ROOT / "eu_audit").rglob("*.py"):
        for name in re.findall(r"^([A-Z_]+): Registry\[", path.read_text(), flags=re.M):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            defined.add(f"{module}:{name}")
    listed = [p.registry for p in EXTENSION_POINTS]
    assert sorted(listed) == sorted(defined) and len(set(listed)) == len(listed)
    assert all(isinstance(p.resolve(), Registry) for p in EXTENSION_POINTS)
    assert extension_points_table() in (ROOT / "docs" / "library.md").read_text()


def _installed_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, files: dict[str, str]
) -> None:
    """A package installed on the path whose ``eu_audit.plugins`` entry point is ``module`` (its files
    written as given), with the group not yet loaded in this process."""
    import eu_audit.plugins as plugins

    for name, text in files.items():
        (tmp_path / name).write_text(text)
    dist = tmp_path / f"{module}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[eu_audit.plugins]\nmine = {module}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_loaded", False)


def test_a_package_plugs_in_through_the_one_entry_point_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from eu_audit.audits.gate import GATE_SETS

    plugin = (
        "from eu_audit.audits.gate import GATE_SETS, GateSet\n"
        "GATE_SETS.add('my-set', GateSet(('agent.residue_store==0',)))\n"
    )
    _installed_plugin(tmp_path, monkeypatch, "my_plugin", {"my_plugin.py": plugin})
    monkeypatch.setattr(GATE_SETS, "_loaded", False)
    monkeypatch.setattr(GATE_SETS, "_items", {})
    assert "my-set" in GATE_SETS  # the plugin's module was imported on the registry's first use
    assert "my_plugin" in sys.modules
    monkeypatch.delitem(sys.modules, "my_plugin")


def test_a_data_set_is_one_object_and_a_package_adds_one_through_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data set is one ``DataSet``: the shipped suites and each registry's data-set modules are read
    from it. A package adds one (``add_data_set`` in its ``eu_audit.plugins`` module) and the registry of
    each kind it names imports its module on first use, as it does ours."""
    import sys

    import eu_audit.plugins as datasets
    from eu_audit.suites import LOADERS, SUITES

    assert datasets.SHIPPED == ("builtin", "agentdojo", "bfcl-memory", "bfcl-tools", "preference")
    assert all(name in SUITES for name in datasets.SHIPPED)
    assert datasets.modules_for("suite_loaders") == ("eu_audit.datasets.longmemeval.loader",)

    files = {
        "my_data.py": "from eu_audit.plugins import DataSet, add_data_set\n"
        "add_data_set(DataSet('mine', 'a test data set', {'suite_loaders': ('my_loader',)}))\n",
        "my_loader.py": "from eu_audit.suites import LOADERS\nLOADERS.add('mine', lambda path: [])\n",
    }
    _installed_plugin(tmp_path, monkeypatch, "my_data", files)
    monkeypatch.setattr(datasets, "DATASETS", dict(datasets.DATASETS))
    assert "longmemeval" in LOADERS  # ours, loaded into the real table before the package comes
    monkeypatch.setattr(LOADERS, "_loaded", False)
    try:
        assert "mine" in LOADERS and "longmemeval" in LOADERS  # theirs too, from its data set
    finally:
        LOADERS._items.pop("mine", None)
        for name in ("my_data", "my_loader"):
            sys.modules.pop(name, None)


def test_every_extension_point_has_a_worked_example_that_runs_and_registers_its_name() -> None:
    """docs/library.md's worked examples: every block runs, in order, in one fresh interpreter, and each
    registry of the extension points gains the name its example registers."""
    import subprocess
    import sys

    from eu_audit.plugins import EXTENSION_POINTS

    text = (ROOT / "docs" / "library.md").read_text().split("## One worked example per extension point")[1]
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    named = re.findall(r"^\*\*(.+?)\*\*", text, flags=re.M)
    covered = {name for line in named for name in re.findall(r"`([A-Z_]+)`", line)}
    assert covered == {p.name for p in EXTENSION_POINTS}, covered ^ {p.name for p in EXTENSION_POINTS}
    # each example's registrations, read from its code: NAME.add("x"), @NAME.register("x"), @method("x")
    wanted = re.findall(r'(?:@?([A-Z_]+)\.(?:add|register)\(|@(method)\()\s*"([^"]+)"', "\n".join(blocks))
    assert len(wanted) >= len(EXTENSION_POINTS)
    imports = [p.registry.split(":") for p in EXTENSION_POINTS]
    check = "\n".join(f"from {module} import {name}" for module, name in imports)
    check += "\nfrom eu_audit.methods import METHODS\n"
    check += "\n".join(f"assert {reg or 'METHODS'}.get({name!r}) is not None" for reg, _, name in wanted)
    script = "\n\n".join(blocks) + "\n" + check + f"\nprint('ok', {len(blocks)})\n"
    env = {**os.environ, "EU_AUDIT_NO_PLUGINS": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-3000:]
