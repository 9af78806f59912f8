from __future__ import annotations

import os

# One thread per model per test worker: the tests run on every core (pytest-xdist, ``-n auto``), and two
# workers' models each spinning a thread per core starve each other (llama.cpp's pool spins while it
# waits; 2 workers x 2 threads on 2 cores took twice the serial time). Set before torch or llama.cpp
# loads, and inherited by every server and agent a test starts.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "EU_AUDIT_THREADS"):
        os.environ.setdefault(_var, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import pytest

from eu_audit.bundle.io import Bundle
from eu_audit.episodes import Episode
from eu_audit.models import FAST_MODEL, TINY_MODEL, LoadedModel, load_model
from eu_audit.suites import load_episodes, load_suite


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    """Randomly initialised 2-layer Llama: mechanics only, never evidence about forgetting."""
    return load_model(TINY_MODEL)


@pytest.fixture(scope="session")
def smol() -> LoadedModel:
    """SmolLM2-135M-Instruct: the fast real model."""
    return load_model(FAST_MODEL)


SMOL_ALL_METHODS = "b0,b1,b4,b5,b7"


@pytest.fixture(scope="session")
def smol_all(smol: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Bundle, Bundle]:
    """The built-in suite on SmolLM2, greedy, the methods the real-model claims read (B0, B1, B4, B5,
    B7): (recorded path, recorded, unlearned bundle at ``recorded path``'s folder / out.jsonl). One
    recording for every test that reads it. Every method's definition is tested on the tiny model
    (test_methods); B5' and B9 equal B5 on the default model in reports/audit-qwen2.5 (rows committed).
    Every test that reads it is in test_methods.py: the test workers take a file each, so one records it."""
    from .helpers import record_and_unlearn

    eps = load_episodes(Path(__file__).parent.parent / "suites" / "builtin.jsonl")
    return record_and_unlearn(smol, tmp_path_factory.mktemp("smol"), eps, [SMOL_ALL_METHODS])


@pytest.fixture(scope="session")
def builtin() -> list[Episode]:
    return load_suite("builtin")


@pytest.fixture()
def memory_episode(builtin: list[Episode]) -> Episode:
    return next(e for e in builtin if e.id == "builtin-memory-address")


@pytest.fixture()
def tool_episode(builtin: list[Episode]) -> Episode:
    return next(e for e in builtin if e.id == "builtin-tool-iban")


@pytest.fixture()
def state(tmp_path: Path):  # type: ignore[no-untyped-def]
    from eu_audit.runtime.memory import MemoryStore, Outbox

    mem, box = MemoryStore(tmp_path / "memory.sqlite"), Outbox(tmp_path / "outbox.sqlite")
    yield mem, box
    mem.close()
    box.close()


#: seconds each test file took in a measured run (``python tools/test_costs.py junit.xml``): the files are
#: handed to the workers longest first (pyproject: ``--no-loadscope-reorder``), so the last file to finish
#: is a short one and both cores stay busy to the end; the order changes no test's outcome
FILE_COSTS = Path(__file__).with_name("file_costs.json")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import json

    try:
        costs: dict[str, float] = json.loads(FILE_COSTS.read_text())
    except (OSError, ValueError):
        return  # no measured costs: collection order, as pytest gives it
    unknown = sorted(costs.values())[len(costs) // 2] if costs else 0.0  # a new file: a middling one
    first_seen = {}
    for i, item in enumerate(items):
        first_seen.setdefault(item.path.name, i)
    items.sort(key=lambda it: (-costs.get(it.path.name, unknown), first_seen[it.path.name]))
