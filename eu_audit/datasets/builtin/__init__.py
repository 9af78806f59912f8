"""The hand-written builtin suite's tools (its episodes are data: suites/builtin.jsonl)."""
