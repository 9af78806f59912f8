"""The trace bundle as a file: its records (``records``, one per JSONL line), reading and writing
(``io``: every line validated, writes atomic and private) and the invariants tying a bundle's records
together (``validate``), checked before anything runs on it. The objects a bundle holds are the trace's
(``eu_audit.trace``)."""
