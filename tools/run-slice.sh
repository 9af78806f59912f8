#!/usr/bin/env bash
# One slice of the default model's n = 30 run, at the commit every slice runs (so the slices stay one run):
#
#   tools/run-slice.sh I [WORKDIR]      # I = 1..15
#
# Checks out commit 018a927 into WORKDIR/code (a detached git worktree; this checkout's .venv runs it),
# records shard I/15 and audits it there (about 35 min on 2 cores), and copies the masked audit JSON to
# reports/audit-qwen2.5/rows/audits/slices/audit-slice-I.json, beside the slices already in. It never overwrites a slice
# already there. Then: add the slice's row to the table in README.md and remake reports/audit-qwen2.5/report.md from the
# folder of slices with --findings and the notes (README.md has the command): the report merges them,
# and its rows are the slices themselves, each state once.
#
# CTX=16384 run-slice.sh 9: a slice whose session outgrows llama.cpp's default context of 8192 tokens and
# its micro-batch of 4096 (slice 9 has one segment of 7,649 tokens). 018a927 predates
# `record --ctx`, so the script sets the engine's defaults as `record --ctx` does today (context CTX,
# micro-batch CTX/2) for both record and audit; neither size changes a logit (tests/test_llamacpp.py::
# test_the_context_size_does_not_change_a_logit), so the slice stays part of the one run.
set -euo pipefail
I=${1:?usage: run-slice.sh I [WORKDIR]   (I = 1..15)}
[[ "$I" =~ ^([1-9]|1[0-5])$ ]] || { echo "slice must be 1..15, got '$I'" >&2; exit 2; }
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
HERE="$ROOT/reports/audit-qwen2.5/slices"
COMMIT=018a927
WORK=${2:-"$ROOT/../eu-slices"}
DEST="$(cd "$HERE/../rows/audits/slices" && pwd)"
[ -e "$DEST/audit-slice-$I.json" ] && { echo "$DEST/audit-slice-$I.json is already there" >&2; exit 2; }
mkdir -p "$WORK/slice-$I"
[ -d "$WORK/code" ] || git -C "$ROOT" worktree add --detach "$WORK/code" "$COMMIT"
[ "$(git -C "$WORK/code" rev-parse --short=7 HEAD)" = "$COMMIT" ] || { echo "$WORK/code is not at $COMMIT" >&2; exit 2; }
EU=("$ROOT/.venv/bin/python" -m eu_audit.cli)
if [ -n "${CTX:-}" ]; then
  [[ "$CTX" =~ ^[0-9]+$ ]] || { echo "CTX must be a number of tokens, got '$CTX'" >&2; exit 2; }
  EU=("$ROOT/.venv/bin/python" -c "import runpy, sys, eu_audit.runtime.llamacpp as L; \
L.LlamaCppEngine.__init__.__kwdefaults__.update(n_ctx=$CTX, n_ubatch=max(4096, $CTX // 2)); \
sys.argv[0] = 'eu-audit'; \
runpy.run_module('eu_audit.cli', run_name='__main__')")
fi
cd "$WORK/slice-$I"
export PYTHONPATH="$WORK/code"
time "${EU[@]}" record --suite agentdojo,bfcl-memory,bfcl-tools,preference --n 30 --shard "$I/15" --seed 0 \
  -o "slice-$I.jsonl" --force
rc=0
time "${EU[@]}" audit "slice-$I.jsonl" --json "audit-slice-$I.json" || rc=$?
# the audit's exit is its verdict on the default rules (1: a method fails, 4: inconclusive at this n):
# either way the slice is data; 2 and 3 are a bad input or a failed run
[[ "$rc" =~ ^[014]$ ]] || { echo "the audit of slice $I exited $rc" >&2; exit "$rc"; }
cp "audit-slice-$I.json" "$DEST/audit-slice-$I.json"
echo "slice $I: $DEST/audit-slice-$I.json"
