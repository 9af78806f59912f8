#!/usr/bin/env bash
# One black-box gate run, as a CI job would run it, for the reports in this folder:
#
#   tools/gate.sh AGENT FORGET SUITE N MODEL OUT
#
#   AGENT   minimal | mem0 | langgraph | openai-agents | llamaindex | langmem (examples/agents/AGENT/agent.py) |
#           eu-audit (eu-audit agent, the control)
#   FORGET  the agent's forget: mem0 | store | none (B0) for the examples; b7 | b1 for eu-audit agent
#   SUITE   builtin, bfcl-memory, ...   N  sessions per suite   MODEL  what eu-audit serve runs
#   OUT     a folder: bundle, serve log, audit JSON, JUnit, the gate's output and exit code, timings
#   K       (environment, default 5) samples per state for Leak@k
#   SIGNING_KEY (environment, optional) an ed25519 PEM key: the audit also writes a signed forget receipt,
#           OUT/receipt.json, checked at once with `eu-audit verify` against SIGNING_KEY's .pub.pem
#   HINT    (environment, optional) 1: send the forget the sanitized text too (record --hint)
#   SHARD   (environment, optional) I/N: record only shard I of N of the sessions (gate --shard); join
#           the shards' bundles afterwards with `eu-audit merge` and audit the merged bundle
#   SESSIONS (environment, optional) FROM:TO: record only sessions FROM to TO-1 of the run of N (gate
#           --sessions): a run in slices, or one continued; join the slices' audits with `eu-audit merge`
#   RECHECK (environment, optional) events after the forget, e.g. at-once,restart,compact,turns-3 (gate --recheck)
#   UNTIL   (environment, optional) 1: record in rounds up to N sessions, stopping at the first failure more
#           sessions cannot undo (gate's default, decided by the forget gate set); unset: --fixed-n
#   AGENT_ARGS (environment, optional) more arguments for an example agent, e.g. --infer for mem0
#   AGENT_PYTHON (environment, optional) the Python that runs the example agent (Letta's own venv)
#   CTX     (environment, optional) serve's context per lane in tokens (serve --ctx), e.g. 16384 for mem0 --infer
#   PIECE   (environment, optional) serve --piece-tokens: prefill messages in pieces of this many tokens, for
#           an agent whose system prompt changes at its end (Letta: 512)
#   AGENT_TIMEOUT (environment, optional) seconds one agent call may take (gate --agent-timeout): a memory
#           library that decodes up to serve's 1,024 tokens several times per turn (mem0 --infer, Graphiti)
#           passes the default 300 s on 2 cores
#
# Needs `pip install -e '.[agents]'` for the examples. Everything runs on loopback; nothing is left running.
set -uo pipefail
AGENT=$1 FORGET=$2 SUITE=$3 N=$4 MODEL=$5 OUT=$6
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$ROOT/.venv/bin"
mkdir -p "$OUT"
SERVE_PORT=$(( 20000 + RANDOM % 20000 )); AGENT_PORT=$(( SERVE_PORT + 1 ))
SERVE="http://127.0.0.1:$SERVE_PORT"; URL="http://127.0.0.1:$AGENT_PORT"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
wait_for() { timeout 600 bash -c "until curl -sf $1 >/dev/null; do sleep 1; done"; }

# the control secret goes to serve's default, a directory only this user can enter (record finds it there)
"$BIN/eu-audit" serve --model "$MODEL" --port "$SERVE_PORT" --log "$OUT/serve.jsonl" --force ${CTX:+--ctx "$CTX"} ${PIECE:+--piece-tokens "$PIECE"} \
  > "$OUT/serve.out" 2>&1 &
pids+=($!)
wait_for "$SERVE/health"
rm -rf "$OUT/agent-data"
case "$AGENT" in
  eu-audit) "$BIN/eu-audit" agent --serve "$SERVE" --forget "$FORGET" --port "$AGENT_PORT" > "$OUT/agent.out" 2>&1 & ;;
  *) OPENAI_BASE_URL="$SERVE/v1" "${AGENT_PYTHON:-$BIN/python}" "$ROOT/examples/agents/$AGENT/agent.py" --port "$AGENT_PORT" \
       --data "$OUT/agent-data" --forget "$FORGET" ${AGENT_ARGS:-} > "$OUT/agent.out" 2>&1 & ;;
esac
pids+=($!)
wait_for "$URL/eu-audit/v1/capabilities"

start=$(date +%s)
# --same-user-ok: these report runs start the agent as this user (a rig on one machine); a gate runs it
# as another user (README, docs/gate-your-agent.md), and record refuses one of its own user without it
# the run alone (--record-only), then the audit apart: the report's rows time each
"$BIN/eu-audit" gate --record-only --agent "$URL" --same-user-ok --serve "$SERVE" \
  --suite "$SUITE" --n "$N" --seed 0 \
  --k "${K:-5}" --out "$OUT/bundle.jsonl" --force ${HINT:+--hint} ${SHARD:+--shard "$SHARD"} ${SESSIONS:+--sessions "$SESSIONS"} \
  ${RECHECK:+--recheck "$RECHECK"} ${AGENT_TIMEOUT:+--agent-timeout "$AGENT_TIMEOUT"} \
  $([ -n "${UNTIL:-}" ] && echo --until-decided || echo --fixed-n) \
  > "$OUT/record.out" 2>&1
rec=$?
recorded=$(date +%s)
"$BIN/eu-audit" audit "$OUT/bundle.jsonl" --json "$OUT/audit.json" --junit "$OUT/junit.xml" --force \
  --gate-set forget ${SIGNING_KEY:+--attest "$OUT/receipt.json" --signing-key "$SIGNING_KEY"} > "$OUT/gate.out" 2>&1
code=$?
if [ -n "${SIGNING_KEY:-}" ]; then
  "$BIN/eu-audit" verify "$OUT/receipt.json" "$OUT/audit.json" "$OUT/bundle.jsonl" \
    --key "${SIGNING_KEY%.pem}.pub.pem" > "$OUT/verify.out" 2>&1
  echo "verify exit $?" >> "$OUT/verify.out"
fi
done_=$(date +%s)
printf '{"agent": "%s", "forget": "%s", "suite": "%s", "n": %s, "k": %s, "model": "%s", "recheck": "%s", "sessions": "%s", "until_decided": %s, "record_exit": %s, "gate_exit": %s, "record_s": %s, "audit_s": %s}\n' \
  "$AGENT" "$FORGET" "$SUITE" "$N" "${K:-5}" "$MODEL" "${RECHECK:-}" "${SESSIONS:-}" "$([ -n "${UNTIL:-}" ] && echo true || echo false)" "$rec" "$code" "$((recorded - start))" "$((done_ - recorded))" > "$OUT/run.json"
cat "$OUT/run.json"
