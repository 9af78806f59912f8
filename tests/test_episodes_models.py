"""Episode validation and model resolution: bad input is refused with a reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from eu_audit.episodes import Episode
from eu_audit.errors import BadInput
from eu_audit.models import DEFAULT_MODEL, MODELS, resolve_model
from eu_audit.suites import load_episodes


def _episode(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "id": "e",
        "suite": "t",
        "target": {"value": "12 Linden Street"},
        "steps": [
            {"kind": "user", "content": "hi"},
            {
                "kind": "memory",
                "content": "Lives at 12 Linden Street.",
                "counterfactual": "Lives somewhere.",
                "source": "src",
            },
        ],
    }
    base.update(over)
    return base


def test_a_valid_episode_knows_its_source_and_tau() -> None:
    ep = Episode.model_validate(_episode())
    assert ep.source_id == "src" and ep.tau == 2


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"steps": [{"kind": "user", "content": "hi"}]}, "no step carries the target"),
        (
            {"steps": [{"kind": "memory", "content": "Lives at 12 Linden Street.", "source": "s"}]},
            "needs 'counterfactual'",
        ),
        (
            {
                "steps": [
                    {
                        "kind": "memory",
                        "content": "Lives at 12 Linden Street.",
                        "counterfactual": "12 linden st",
                        "source": "s",
                    }
                ],
                "target": {"value": "12 Linden Street", "variants": ["12 linden st"]},
            },
            "still contains the target",
        ),
        (
            {"steps": [{"kind": "user", "content": "nothing here", "counterfactual": "x", "source": "s"}]},
            "does not contain the target",
        ),
        ({"steps": [{"kind": "tool", "tool": "get_payee", "source": "s"}]}, "counterfactual_env"),
        ({"memory": [{"id": "m", "text": "12 Linden Street"}]}, "tau = 0"),
    ],
)
def test_malformed_episodes_are_refused(change: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        Episode.model_validate(_episode(**change))


def test_duplicate_episode_ids_name_the_line(tmp_path: Path) -> None:
    ep = Episode.model_validate(_episode()).model_dump_json()
    path = tmp_path / "dup.jsonl"
    path.write_text(ep + "\n" + ep + "\n")
    with pytest.raises(BadInput, match=r"dup.jsonl:2: field 'id'"):
        load_episodes(path)


def test_model_references_resolve_or_fail_clearly(tmp_path: Path) -> None:
    assert resolve_model(DEFAULT_MODEL).role == "default"
    assert {"qwen2.5-coder-0.5b", "smollm2-135m", "tiny-random"} <= set(MODELS.names())
    with pytest.raises(BadInput, match="hub"):
        resolve_model("Qwen/Qwen2.5-7B-Instruct")
    (tmp_path / "notamodel").mkdir()
    with pytest.raises(BadInput, match=r"no config\.json"):
        resolve_model(str(tmp_path / "notamodel"))


def test_embedded_weights_carry_their_pinned_digest(tiny, smol) -> None:  # type: ignore[no-untyped-def]
    assert smol.weight_digest == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert len(smol.chat_template_digest) == 64
    assert tiny.weight_digest != smol.weight_digest
