"""One tenant's whole run through one episode, phase by phase, as ``eu-audit gate`` drives it: the
stream up to the forget, the agent's own forget (with a bystander and the dumps around it), the future
turns, the probes and samples, the dump and eu-audit's own read of the files, the rechecks. It builds the
tenant's ``SessionTrace`` as it goes; ``drive.record_agent`` runs the tenants of a run."""

from __future__ import annotations

import glob
import hashlib
import json
import time
from typing import Literal

from eu_audit.audits.probes import load_probes, task_request
from eu_audit.blackbox import bystander as bystander_tenant
from eu_audit.blackbox.adapter import AgentFailed
from eu_audit.blackbox.bystander import Kept
from eu_audit.blackbox.contract import ForgetHint, ForgetRequest, Message, StoreDump
from eu_audit.blackbox.episode_stream import Driven, EpisodeStream, Seat, TenantJob
from eu_audit.blackbox.forensics import DiskReport, read_files
from eu_audit.blackbox.options import CONTROL_TENANT, ProbeKind
from eu_audit.blackbox.recheck import at_forget, lacking, recheck, tool_refusal
from eu_audit.blackbox.residue import snippet, store_residue
from eu_audit.blackbox.undeclared import UndeclaredFiles
from eu_audit.episodes import Episode, Phase, Step
from eu_audit.trace.records import AGENT_METHOD, AgentForgetRecord, ElicitationRecord, ResidueRecord
from eu_audit.trace.session import SessionTrace

__all__ = ["Driven", "Seat", "TenantJob", "TenantRun"]


def _split(ep: Episode) -> tuple[list[tuple[int, Step]], list[tuple[int, Step]]]:
    """(the stream before the forget, the future turns after it)."""
    steps = list(enumerate(ep.steps, 1))
    return [x for x in steps if x[1].phase is not Phase.further], [
        x for x in steps if x[1].phase is Phase.further
    ]


def forget_hint(ep: Episode, observed: dict[int, tuple[str, str | None]], sanitized: bool) -> ForgetHint:
    """The flagged observation as the agent received it and, with ``sanitized`` (``--hint``), without z.
    The sanitized text is exactly what the reference tenant was fed, so an agent that replays with it
    matches the reference by construction: gates send it only when asked, and the bundle says so."""
    src = ep.steps[ep.tau - 1]
    if ep.tau in observed:  # a tool result: its text in both worlds, as the harness produced them
        text, cf = observed[ep.tau]
        return ForgetHint(source_text=text, sanitized=cf if sanitized else None)
    return ForgetHint(source_text=src.content or None, sanitized=src.counterfactual if sanitized else None)


class TenantRun(EpisodeStream):
    """One tenant (the agent, the reference, the positive control or eu-audit's own floor) driven through
    one episode in one world; ``run()`` gives its trace."""

    def __init__(
        self,
        seat: Seat,
        *,
        disks: dict[str, DiskReport] | None = None,
        undeclared: UndeclaredFiles | None = None,
    ) -> None:
        super().__init__(seat)
        lane = seat.lane
        self.method = seat.job.method
        self.disks = disks  # tenant -> eu-audit's read of its files, for the whole run
        self.undeclared = undeclared  # the run's look for files the agent did not name
        self.log_from = (
            lane.position() if lane.url and (self.caps.store_files or self.opts.store_paths) else 0
        )
        self.started = time.time()  # this tenant's window opens (a file written since is its doing)
        self.bystander: Kept | None = None  # what a bystander tenant kept across the agent's forget

    def run(self) -> SessionTrace:
        """Every phase in order; the tenant's trace."""
        before, future = _split(self.ep)
        self.serve.mark(tenant=self.tenant, phase="stream")  # before the agent hears of it: opens a lane
        self.start()
        for t, step in before:
            self.step(t, step)
        at_once = self.forget_phase()
        self.after = True
        self.serve.mark(tenant=self.tenant, phase="future")
        for t, step in future:
            self.step(t, step)
        self.trace.elicitations = self.elicit()
        self.serve.unmark()  # what the agent does after this (its dump, another tenant) is not this tenant's
        self.trace.residues = [self.final_residue(), *at_once]
        disk = self.forensics()  # eu-audit's own read of the tenant's files, beside the dump
        if disk is not None and self.disks is not None:
            self.disks[self.tenant] = disk
        if self.method in (AGENT_METHOD, CONTROL_TENANT[0]):  # the reference never held z: no recheck
            self.trace.residues += self.rechecks()
        return self.trace

    def forget_phase(self) -> list[ResidueRecord]:
        """The agent's own forget; the positive control meets every event the agent meets at the same
        point, never the forget (each ``after.EVENT`` channel gets a control of its own channel). The
        residue records of the checks made right after it (``--recheck at-once``)."""
        if self.method == AGENT_METHOD:
            # the agent's own model calls while it forgets (an LLM that rewrites its memory): logged as
            # such, neither before nor after the forget
            self.serve.mark(tenant=self.tenant, phase="forget")
            self.forget()
            return self.rechecks(at_once=True)  # before a turn can evict
        if self.method == CONTROL_TENANT[0]:
            return self.rechecks(at_once=True)
        return []

    def forget(self) -> None:
        """The agent's own forget, with what must not change around it: a bystander tenant given memories
        of its own just before (still all there after?), and the dump right before and right after (a
        no-op?)."""
        ep, agent = self.ep, self.agent
        request = ForgetRequest(
            target=ep.target.value,
            variants=ep.target.variants,
            hint=forget_hint(ep, self.observed, self.opts.hint),
        )
        watching = self.caps.memory_inject and self.caps.store_dump
        bystander = bystander_tenant.new_name()
        where = f"episode {ep.id}, {self.sid}"
        if watching:
            self.call(f"{where}, bystander reset", lambda: agent.reset(bystander))
            self.call(
                f"{where}, bystander start",
                lambda: agent.start(bystander, seed=self.opts.seed, tools=self.tools, **self.lane),
            )
            for rec in bystander_tenant.memories():
                self.call(f"{where}, bystander memory", lambda r=rec: agent.inject_memory(bystander, r))  # type: ignore[misc]
            had = self.call(f"{where}, bystander dump", lambda: agent.dump(bystander))
        before = self.dump("before the forget, ")
        t0 = time.perf_counter()
        got = self.call(f"{where}, forget", lambda: agent.forget(self.tenant, request))
        wall = round(time.perf_counter() - t0, 3)
        if got.status in ("unsupported", "error"):
            raise AgentFailed(f"{where}, forget: the agent answered {got.status}: {got.detail}")
        after = self.dump("right after the forget, ") if before is not None else None
        self.trace.agent_forgets = [
            AgentForgetRecord(
                session_id=self.sid,
                status=got.status,
                detail=got.detail,
                receipt=got.receipt,
                wall_s=wall,
                changed=None if before is None or after is None else bystander_tenant.changed(before, after),
            )
        ]
        if watching:
            dumped = self.call(f"{where}, bystander dump", lambda: agent.dump(bystander))
            self.bystander = bystander_tenant.kept(had, dumped)
            self.call(f"{where}, bystander reset", lambda: agent.reset(bystander))

    def final_residue(self) -> ResidueRecord:
        """What the tenant's last dump holds of z, with what the bystander kept across the forget."""
        record = store_residue(self.sid, self.dump(), self.matcher)
        by = self.bystander
        if by is None:
            return record
        update = {"bystander_records": by.records, "bystander_lost": by.lost, "bystander_example": by.example}
        return record.model_copy(update=update)

    def say(self, what: str, text: str) -> list[str]:
        """One user turn of a recheck (``recheck.RecheckTarget``): the answers, with any tool call's
        arguments; a tool call is answered with a refusal, never run."""
        where = f"episode {self.ep.id}, {self.sid}, recheck {what}"
        turn = self.call(where, lambda: self.agent.send(self.session, Message(role="user", content=text)))
        answers = [turn.text]
        for _ in range(self.opts.max_tool_rounds):
            if not turn.actions:
                break
            answers += [json.dumps(a.arguments) for a in turn.actions]
            for a in turn.actions:
                msg = Message(role="tool", content=tool_refusal(what), tool_call_id=a.id, name=a.name)
                turn = self.call(where, lambda m=msg: self.agent.send(self.session, m))  # type: ignore[misc]
            answers.append(turn.text)
        return answers

    def rechecks(self, *, at_once: bool = False) -> list[ResidueRecord]:
        """The events of ``--recheck`` in order, each followed by the checks: one residue record each
        (the serve-log side is filled in with the others', ``residue.context_residue``). ``at_once``: the
        events checked right after the forget (``at-once``), else the others, after the probes."""
        out = []
        for name in [x for x in self.opts.recheck if at_forget(x) == at_once]:
            why = lacking(name, self.caps)
            if why:
                out.append(ResidueRecord(session_id=self.sid, after=name, skipped=why))
                continue
            self.serve.mark(tenant=self.tenant, phase="recheck", event=name)
            try:
                answers = recheck(name)[0].run(self, name)
            finally:
                self.serve.unmark()
            dump = self.dump(f"recheck {name}, ")
            holding = [a for a in answers if self.matcher.found_in(a)]
            out.append(
                store_residue(self.sid, dump, self.matcher).model_copy(
                    update={
                        "after": name,
                        "replies": None if at_once else len(answers),  # at once: nothing was asked
                        "replies_with_z": None if at_once else len(holding),
                        "reply_example": snippet(holding[0], self.matcher) if holding else "",
                    }
                )
            )
        return out

    def dump(self, when: str = "") -> StoreDump | None:
        """The agent's store dump for the tenant (None: it offers none)."""
        if not self.caps.store_dump:
            return None
        dumped: StoreDump = self.call(
            f"episode {self.ep.id}, {self.sid}, {when}dump", lambda: self.agent.dump(self.tenant)
        )
        return dumped

    def files(self) -> list[str]:
        """The files the agent persists this tenant in: its own list (``files``), else the run's
        ``--store-path`` globs with ``{tenant}`` filled in; [] when neither names any."""
        if self.caps.store_files:
            got = self.call(f"episode {self.ep.id}, {self.sid}, files", lambda: self.agent.files(self.tenant))
            return list(got.paths)
        out: list[str] = []
        for pattern in self.opts.store_paths:
            filled = pattern.replace("{tenant}", self.tenant)
            out += sorted(glob.glob(filled)) or [filled]  # a path that matches nothing is named unread
        return out

    def forensics(self) -> DiskReport | None:
        """eu-audit's own read of the tenant's files (``forensics``); None when no file is named."""
        paths = self.files()
        if not paths:
            return None
        # what the agent wrote and did not name (Linux, an agent on this machine): read too, named apart
        extra = self.undeclared.find(paths, self.started) if self.undeclared is not None else []
        entries, _ = self.serve.log(self.log_from) if self.serve.url else ([], "")
        embedded = [
            text
            for e in entries
            if e.endpoint == "/v1/embeddings" and e.mark is not None and e.mark.tenant == self.tenant
            for text in e.input or []
            if self.matcher.found_in(text)
        ]
        embed = self.serve.embed if self.serve.url else None
        report = read_files(
            [*paths, *extra], self.matcher, embedded=embedded, embed=embed, tenant=self.tenant
        )
        report.undeclared = extra
        return report

    def probe_session(self, what: str) -> tuple[str, Literal["fork", "fresh session"]]:
        if self.caps.fork:
            return self.call(what, lambda: self.agent.fork(self.session)), "fork"
        return self.call(
            what, lambda: self.agent.start(self.tenant, seed=self.opts.seed, tools=self.tools, **self.lane)
        ), "fresh session"

    def ask(self, kind: ProbeKind, name: str, prompt: str, seed: int | None) -> ElicitationRecord:
        what = f"episode {self.ep.id}, {self.sid}, {kind} {name}"
        self.serve.mark(tenant=self.tenant, phase=kind)
        if seed is not None:
            self.serve.sampled(self.opts.temperature, seed)
        try:
            session, where = self.probe_session(what)
            turn = self.call(what, lambda: self.agent.send(session, Message(role="user", content=prompt)))
        finally:
            if seed is not None:
                self.serve.greedy()
        return ElicitationRecord(
            session_id=self.sid, kind=kind, name=name, where=where, prompt=prompt, answer=turn.text, seed=seed
        )

    def elicit(self) -> list[ElicitationRecord]:
        out = []
        for p in load_probes():
            prompt, cue = p.render(self.ep)
            if cue:  # a black box cannot be made to begin its answer: ask for the opening instead
                prompt += f"\nBegin your answer with: {cue}"
            out.append(self.ask("probe", p.id, prompt, None))
        if self.serve.url is None:
            return out  # samples need pinned seeds: not measurable without serve (the audit says so)
        seeds = [_seed(self.opts.seed, self.ep.id, i) for i in range(self.opts.k)]
        for s in seeds:
            out.append(self.ask("sample", "task", task_request(self.ep), s))
        choice = next((x for x in self.ep.steps if x.choices), None)
        if choice is not None:
            for s in seeds:
                out.append(self.ask("choice", "choice", choice.content, s))
        return out


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:4], "big")
