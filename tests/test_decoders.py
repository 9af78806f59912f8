"""z sent encoded is z: a prompt that carries the target as base64, hex, percent-encoded three times,
escapes, look-alike letters or reversed holds it, because a model reads the decoding
(``eu_audit.matching.decoders``), and no text of the labelled set without z is made to show it."""

from __future__ import annotations

import base64
import urllib.parse

import pytest

from eu_audit.blackbox.residue import tiers_with_z
from eu_audit.matching import TargetMatcher
from eu_audit.matching.evaluate import read_rows, score_matcher

from .helpers import logged

Z = "DE89 3704 0044 0532 0130 00"
SAID = f"Your IBAN is {Z}."


def triple_percent(text: str) -> str:
    for _ in range(3):
        text = urllib.parse.quote(text, safe="")
    return text


ENCODED = {
    "base64": base64.b64encode(SAID.encode()).decode(),
    "url-safe base64": base64.urlsafe_b64encode(SAID.encode()).decode().rstrip("="),
    "hex": SAID.encode().hex(),
    "hex bytes": " ".join(f"{b:02x}" for b in SAID.encode()),
    "percent-encoded three times": triple_percent(SAID),
    "python escapes": "".join(f"\\x{ord(c):02x}" for c in SAID),
    "json escapes": "".join(f"\\u{ord(c):04x}" for c in SAID),
    "HTML entities": "".join(f"&#{ord(c)};" for c in SAID),
    "reversed": SAID[::-1],
}


@pytest.mark.parametrize("how", ENCODED)
def test_z_sent_encoded_in_a_prompt_is_found_and_the_finding_says_how_without_carrying_it(how: str) -> None:
    entry = logged(endpoint="/v1/chat/completions", messages=[{"role": "user", "content": ENCODED[how]}])
    matcher = TargetMatcher.of(Z)
    tiers, example = tiers_with_z(entry, matcher)
    assert tiers == ["user"], (how, example)
    assert example.startswith("[history: user turns")  # the tier in words (and how it was sent, if decoded)
    # the example quotes the decoded text, which every output masks like any z; an encoded text the
    # matcher does not fold itself would carry z past the masks
    assert matcher.found_in(example)
    assert ENCODED[how] not in example or matcher.found_in(ENCODED[how])  # escapes, entities: folded


def test_z_in_look_alike_letters_of_another_script_is_found() -> None:
    z = "Maria Petrova"
    cyrillic = "Mаriа Pеtrоvа"  # Cyrillic a, e, o: the same letters to a reader and to a model
    entry = logged(
        endpoint="/v1/chat/completions", messages=[{"role": "system", "content": f"User: {cyrillic}"}]
    )
    tiers, example = tiers_with_z(entry, TargetMatcher.of(z))
    assert tiers and "look-alike letters" in example


def test_no_labelled_text_without_z_is_made_to_show_it_by_a_decoder() -> None:
    scores = score_matcher(read_rows())
    assert scores.tn >= 300 and scores.decoded_false_alarms == {}
