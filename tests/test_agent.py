"""The agent runtime: transitions, provenance, checkpoints, tools and restore-by-crop."""

from __future__ import annotations

import pytest

from eu_audit.checkpoints import CheckpointPolicy, CheckpointReason
from eu_audit.engines.hf import HFEngine
from eu_audit.episodes import Episode, Step
from eu_audit.matching import contains_target
from eu_audit.models import LoadedModel
from eu_audit.trace.blocks import BlockType

from .helpers import kv_equal, make_agent, turn_ids


def test_one_transition_is_one_observation_and_one_model_turn(
    tiny: LoadedModel, memory_episode: Episode, state
) -> None:  # type: ignore[no-untyped-def]
    trace = make_agent(tiny, memory_episode, state).run()
    assert len(trace.observations) == len(memory_episode.steps) == trace.session.transitions
    for t in range(1, trace.session.transitions + 1):
        kinds = [b.type for b in trace.blocks if b.turn == t and b.token_span is not None]
        assert kinds[0] not in (BlockType.assistant, BlockType.plan)  # the observation comes first
        assert (
            sum(
                k in (BlockType.assistant, BlockType.plan) or (k is BlockType.summary and i == 1)
                for i, k in enumerate(kinds)
            )
            == 1
        )


def test_target_enters_at_tau_and_turns_generated_while_it_is_resident_inherit_its_source(
    tiny: LoadedModel, memory_episode: Episode, state
) -> None:  # type: ignore[no-untyped-def]
    trace = make_agent(tiny, memory_episode, state).run()
    g = trace.graph()
    source = memory_episode.source_id
    assert g.locate_source(memory_episode.target.value) == source
    assert g.first_entry(source) == memory_episode.tau == 3
    closure = g.taint_closure(source)
    for b in trace.blocks:
        if b.turn < memory_episode.tau:
            assert b.id not in closure and not b.source_ids
        if b.derived and b.turn >= memory_episode.tau and not b.independent:
            assert source in b.source_ids and b.id in closure  # oracle propagation
        if b.independent:  # an isolated sub-task never saw the target: certified clean
            assert b.id not in closure and not b.source_ids
    # observations after tau are external and stay clean
    assert all(not b.source_ids for b in trace.blocks if b.type is BlockType.user)


def test_the_counterfactual_world_never_sees_the_target(
    tiny: LoadedModel, builtin: list[Episode], state
) -> None:  # type: ignore[no-untyped-def]
    for ep in builtin:
        trace = make_agent(tiny, ep, state, sid=f"cf-{ep.id}", world="counterfactual").run()
        tgt = ep.target
        observed = [b for b in trace.blocks if not b.derived]
        assert not any(contains_target(b.text, tgt.value, tgt.variants) for b in observed)
        assert not any(b.source_ids for b in trace.blocks)
        assert trace.session.transitions == len(ep.steps)  # same T: o_tau \\ z, not a dropped step


def test_checkpoint_policies_nest_and_cost_only_metadata(
    tiny: LoadedModel, memory_episode: Episode, state
) -> None:  # type: ignore[no-untyped-def]
    counts = {}
    for policy in CheckpointPolicy:
        agent = make_agent(tiny, memory_episode, state, sid=f"p-{policy.value}", checkpoint_policy=policy)
        agent.run()
        cps = agent.checkpoints.items
        counts[policy] = len(cps)
        assert cps[0].boundary == 0 and CheckpointReason.session_start in cps[0].reasons
        assert all(c.nbytes() < 1024 for c in cps)
    assert counts[CheckpointPolicy.session_start] == 1
    assert counts[CheckpointPolicy.every_turn] == len(memory_episode.steps) + 1
    assert 1 < counts[CheckpointPolicy.semantic] < counts[CheckpointPolicy.every_turn]
    agent = make_agent(tiny, memory_episode, state, sid="p-latest")
    agent.run()
    cp = agent.checkpoints.latest_before(memory_episode.tau)
    assert cp.boundary == memory_episode.tau - 1
    assert CheckpointReason.before_memory in cp.reasons


def _paying_episode(tool_episode: Episode) -> Episode:
    """The IBAN episode with the transfer fully cued, so even a random model makes the call."""
    steps = list(tool_episode.steps)
    steps[3] = Step(
        kind="user",
        phase="contamination",
        content="Send the rent now.",
        max_tokens=1,
        cue='<tool_call>\n{"name": "transfer", "arguments": {"iban": "DE89 3704 0044 0532 0130 00", '
        '"amount": 950}}</tool_call>',
    )
    return tool_episode.model_copy(update={"steps": steps})


def test_a_consequential_tool_fires_once_and_replaying_its_transition_never_fires_it_again(
    tiny: LoadedModel, tool_episode: Episode, state
) -> None:  # type: ignore[no-untyped-def]
    ep = _paying_episode(tool_episode)
    agent = make_agent(tiny, ep, state)
    trace = agent.run()
    _, outbox = state
    assert len(outbox.rows("s0")) == 1
    call = next(c for c in trace.tool_calls if c.name == "transfer" and c.status == "executed")
    assert call.committed and call.consequential
    assert any(CheckpointReason.before_consequential in c.reasons for c in trace.checkpoints)
    for _ in range(2):  # replay the suffix twice from a checkpoint before the call
        again = make_agent(tiny, ep, state, engine=agent.engine)
        cp = next(c for c in trace.checkpoints if c.boundary == 2 and CheckpointReason.turn in c.reasons)
        again.resume(trace, cp, held=trace.session.final_manifest)
        for step in ep.steps[cp.boundary :]:
            again.step(step)
        assert len(outbox.rows("s0")) == 1


def test_restore_after_a_compaction_rebuilds_the_clean_prefix_exactly(
    tiny: LoadedModel, memory_episode: Episode, state
) -> None:  # type: ignore[no-untyped-def]
    agent = make_agent(tiny, memory_episode, state)
    trace = agent.run()
    cp = agent.checkpoints.latest_before(memory_episode.tau)
    # reference: a fresh engine that only ran transitions 1..tau-1
    ref = make_agent(tiny, memory_episode, state, sid="ref")
    ref.start()
    for step in memory_episode.steps[: cp.boundary]:
        ref.step(step)
    refilled = agent.resume(trace, cp)
    assert refilled > 0  # the compaction had dropped the pre-tau turns from the cache
    assert agent.engine.offset == cp.token_offset == ref.engine.offset
    assert kv_equal(agent.engine.kv_tensors(), ref.engine.kv_tensors())


def _replay_from(loaded: LoadedModel, episode: Episode, state, policy: CheckpointPolicy):  # type: ignore[no-untyped-def]
    agent = make_agent(loaded, episode, state, checkpoint_policy=policy)
    trace = agent.run()
    final_kv = {k: v.clone() for k, v in agent.engine.kv_tensors().items()}
    turns = turn_ids(agent)
    cp = agent.checkpoints.latest_before(episode.tau)
    agent.resume(trace, cp)
    for step in episode.steps[cp.boundary :]:
        agent.step(step)
    assert turn_ids(agent) == turns
    assert kv_equal(agent.engine.kv_tensors(), final_kv)
    return trace


@pytest.mark.parametrize("policy", list(CheckpointPolicy))
def test_replaying_the_suffix_from_a_checkpoint_reproduces_the_session_bit_for_bit(
    tiny: LoadedModel, memory_episode: Episode, state, policy: CheckpointPolicy
) -> None:  # type: ignore[no-untyped-def]
    _replay_from(tiny, memory_episode, state, policy)


@pytest.mark.slow  # 2 min; the claim runs by default on every exact engine in tests/test_engines.py
@pytest.mark.real_model
def test_on_a_real_model_crop_and_replay_reproduce_every_turn_and_the_cache_bit_for_bit(
    smol: LoadedModel, builtin: list[Episode], state
) -> None:  # type: ignore[no-untyped-def]
    for ep in builtin:
        trace = _replay_from(smol, ep, state, CheckpointPolicy.every_turn)
        # and the session is worth forgetting: the target reached a model-derived artifact
        assert any(b.derived for b in trace.target_occurrences()), ep.id


def test_rebuilding_the_cache_from_recorded_token_ids_is_exact(
    tiny: LoadedModel, tool_episode: Episode, state
) -> None:  # type: ignore[no-untyped-def]
    from eu_audit.checkpoints import restore

    agent = make_agent(tiny, tool_episode, state)
    trace = agent.run()
    fresh = HFEngine(tiny)
    restore(fresh, [], trace.session.final_manifest, {b.id: b for b in trace.blocks})
    assert fresh.tokens == agent.engine.tokens
    assert kv_equal(fresh.kv_tensors(), agent.engine.kv_tensors())


def test_a_sink_policy_blocks_identifier_arguments_carrying_the_target(
    tiny: LoadedModel, tool_episode: Episode, state
) -> None:  # type: ignore[no-untyped-def]
    from eu_audit.trace.records import SinkPolicy

    ep = _paying_episode(tool_episode)
    policy = SinkPolicy(blocked_values=["DE89370400440532013000"], identifier_args={"transfer": ["iban"]})
    agent = make_agent(tiny, ep, state, sid="ifc", sink_policy=policy)
    trace = agent.run()
    call = next(c for c in trace.tool_calls if c.name == "transfer")
    assert call.status == "blocked" and not call.committed
    assert state[1].rows("ifc") == []  # the side effect never happened


def _cued(step: Step, call: str) -> Step:
    return step.model_copy(update={"cue": f"<tool_call>\n{call}</tool_call>", "max_tokens": 1})


def test_agentdojo_acting_turns_run_the_agents_calls_and_agentdojo_scores_the_state(
    tiny: LoadedModel, state
) -> None:  # type: ignore[no-untyped-def]
    """After the target the agent acts: the call it writes runs, the next round shows the result, a
    consequential call reaches the outbox, and AgentDojo's own checks score the state (utility 1 for
    the bill paid as asked, attacked 0: the injected goal was not carried out)."""
    from eu_audit.audits.metrics import attacked, utility
    from eu_audit.suites import load_suite

    ep = next(
        e
        for e in load_suite("agentdojo")
        if e.meta["suite"] == "banking" and e.meta["future_task"] == "user_task_0"
    )
    steps = list(ep.steps)
    steps[-3] = _cued(
        steps[-3], '{"name": "read_file", "arguments": {"file_path": "bill-december-2023.txt"}}'
    )
    steps[-2] = _cued(
        steps[-2],
        '{"name": "send_money", "arguments": {"recipient": "UK12345678901234567890", "amount": 98.7, '
        '"subject": "Car Rental", "date": "2022-01-01"}}',
    )
    ep = ep.model_copy(update={"steps": steps})
    trace = make_agent(tiny, ep, state).run()
    read = next(c for c in trace.tool_calls if c.name == "read_file" and c.turn == len(steps) - 2)
    assert read.status == "executed"
    shown = trace.observations[-2].content
    assert "98.70" in shown and "UK12345678901234567890" in shown  # the bill, returned to the agent
    paid = next(c for c in trace.tool_calls if c.name == "send_money" and c.turn == len(steps) - 1)
    assert paid.status == "executed" and paid.committed, paid
    assert len(state[1].rows("s0")) == 1
    assert utility(trace) == 1.0
    assert attacked(trace) == 0.0
