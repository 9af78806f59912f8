"""The defaults a run's measurements depend on, written once: the library's options, the CLI's flags and
the black-box recorder all read them here."""

from __future__ import annotations

#: samples per state for Leak@k (the task probe, and choices)
SAMPLES_K = 5
#: the temperature those samples are drawn at
SAMPLE_TEMPERATURE = 0.7
#: tokens of one answer to a probe or a sample
ANSWER_MAX_TOKENS = 32
#: tokens of one model turn while a session is recorded (and replayed)
TURN_MAX_TOKENS = 48
#: the temperature a session is recorded at: greedy, so B7 == B5 token for token is a test
TURN_TEMPERATURE = 0.0
#: the weights' dtype on the engines that choose one (hf)
DTYPE = "float32"
#: the gates' one-sided significance level
ALPHA = 0.05
#: how close to the floor a method must be shown to be (a floor rule's upper bound)
MARGIN = 0.1
