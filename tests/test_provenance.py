"""Lemma 2 as properties: the taint closure is monotone, and blocks before tau are never tainted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eu_audit.errors import BadInput
from eu_audit.trace.blocks import BlockType, RuntimeBlock
from eu_audit.trace.provenance import ArtifactGraph

SOURCE = "src-z"


@st.composite
def sessions(draw: st.DrawFn) -> list[RuntimeBlock]:
    """A random session: observations and model turns; the target enters at one observation (tau);
    a turn's parents are drawn from earlier blocks, and it inherits the source (oracle propagation)
    when any parent carries it."""
    n = draw(st.integers(3, 30))
    tau_index = draw(st.integers(1, n - 1))
    blocks: list[RuntimeBlock] = []
    turn = 0
    for i in range(n):
        is_obs = i == tau_index or draw(st.booleans())
        if is_obs:
            turn += 1
        parents = (
            []
            if is_obs or not blocks
            else sorted(set(draw(st.lists(st.sampled_from([b.id for b in blocks]), min_size=1, max_size=4))))
        )
        sources = (
            [SOURCE]
            if i == tau_index
            else sorted({s for b in blocks if b.id in parents for s in b.source_ids})
        )
        blocks.append(
            RuntimeBlock(
                id=f"b{i}",
                type=BlockType.user if is_obs else BlockType.assistant,
                parents=parents,
                source_ids=sources,
                turn=turn,
                derived=not is_obs,
                text="12 Linden Street" if i == tau_index else "hello",
            )
        )
    return blocks


@given(sessions())
@settings(max_examples=150, deadline=None)
def test_taint_closure_is_monotone_as_the_session_grows(blocks: list[RuntimeBlock]) -> None:
    g = ArtifactGraph()
    previous: set[str] = set()
    for b in blocks:
        g.add(b)
        if not g.entry_blocks(SOURCE):
            continue
        closure = g.taint_closure(SOURCE)
        assert previous <= closure
        previous = closure


@given(sessions())
@settings(max_examples=150, deadline=None)
def test_blocks_before_tau_are_never_tainted(blocks: list[RuntimeBlock]) -> None:
    g = ArtifactGraph(blocks)
    tau = g.first_entry(SOURCE)
    closure = g.taint_closure(SOURCE)
    assert all(g.blocks[b].turn >= tau for b in closure)
    assert {b.id for b in blocks if b.turn < tau}.isdisjoint(closure)


@given(sessions())
@settings(max_examples=100, deadline=None)
def test_locate_source_finds_the_entry_and_the_closure_holds_every_descendant(
    blocks: list[RuntimeBlock],
) -> None:
    g = ArtifactGraph(blocks)
    assert g.locate_source("12 linden st.", variants=["12 Linden St"]) == SOURCE
    closure = g.taint_closure(SOURCE)
    for bid in closure:
        assert all(c in closure for c in g.children[bid])


def test_unknown_target_and_source_are_bad_input() -> None:
    g = ArtifactGraph([RuntimeBlock(id="b0", type=BlockType.user, turn=1, text="hello")])
    with pytest.raises(BadInput, match="does not occur"):
        g.locate_source("DE89 3704")
    with pytest.raises(BadInput, match="does not exist"):
        g.first_entry("src-missing")
    with pytest.raises(BadInput, match="does not exist"):
        g.taint_closure("src-missing")


def test_graph_refuses_unknown_parents_and_duplicates() -> None:
    g = ArtifactGraph([RuntimeBlock(id="b0", type=BlockType.user, turn=1)])
    with pytest.raises(ValueError, match="unknown parent"):
        g.add(RuntimeBlock(id="b1", type=BlockType.assistant, turn=1, parents=["nope"]))
    with pytest.raises(ValueError, match="twice"):
        g.add(RuntimeBlock(id="b0", type=BlockType.user, turn=1))
