"""The defaults a run's measurements depend on, written once: the library's options, the CLI's flags and
the black-box recorder all read them here."""

from __future__ import annotations

#: samples per state for Leak@k (the task probe, and choices)
SAMPLES_K = 5
#: the temperature those samples are drawn at
SAMPLE_TEMPERATURE = 0.7
#: tokens of one answer to a probe or a sample
ANSWER_MAX_TOKENS = 32
