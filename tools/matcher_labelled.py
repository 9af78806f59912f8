"""Build ``eu_audit/matching/labelled.jsonl``, the labelled set the target matcher is measured on.

Two halves, each row marked by the rule in ``eu_audit/matching/__init__.py`` (``label``: ``leak``,
``no-leak``, or ``paraphrase``: z said in other words or only in part, which no string matcher is meant
to catch; ``eu-audit matcher`` prints its recall apart and gates nothing on it):

- *drawn*: texts the committed runs produced (probe answers and samples in ``reports/**`` audits), with
  the episode's target from ``suites/``; every one read and labelled by hand (``LABELS`` below, keyed by
  the row's source), chosen as the texts that share a word of 4+ letters with their target (the hard
  cases) and the texts where the matcher of 7cb0e9e and this one disagree; plus texts sharing no word
  with their target (``no-leak`` by that alone);
- *written*: each distinct suite target (and a few in other scripts) rewritten the ways a model writes
  it (``leak``), and near misses (``no-leak``): another number, another target of the same kind, a
  short article phrase.

Run from the repository root: ``python tools/matcher_labelled.py`` (deterministic; rewrites the file).
"""

from __future__ import annotations

import glob
import json
import random
import re
import urllib.parse
from pathlib import Path

from eu_audit.matching.numbers import TEENS, TENS, UNITS

OUT = Path("eu_audit/matching/labelled.jsonl")
#: drawn rows read by hand: source -> label; a source not here is not drawn
LABELS_FILE = Path("tools/matcher_drawn_labels.json")

NUM = list(UNITS)
SMALL = NUM + list(TEENS)
TENS_WORDS = ["_", "_", *TENS]
OTHER_SCRIPTS = [
    ("José García", "address"),
    ("Hauptstraße 5, 10115 Berlin", "address"),
    ("Οδός Αθηνάς 12", "address"),
    ("улица Ленина 7", "address"),
    ("Zoë Ødegård", "name"),
    ("François Lefèvre", "name"),
    ("Ελένη Παπαδοπούλου", "name"),
    ("Дмитрий Смирнов", "name"),
]


def words_for(n: int) -> str:
    if n < 20:
        return SMALL[n]
    if n < 100:
        return TENS_WORDS[n // 10] + ("" if n % 10 == 0 else "-" + SMALL[n % 10])
    rest = n % 100
    return SMALL[n // 100] + " hundred" + ("" if rest == 0 else " and " + words_for(rest))


def spell(value: str, as_numbers: bool) -> str | None:
    """Numbers of the target spelled out as a reader would say them: a house number (``as_numbers``) below
    1000 as a number ("twelve"), phone numbers, codes and longer ones digit by digit ("D E eight nine")."""
    if not re.search(r"\d", value):
        return None

    def token(m: re.Match[str]) -> str:
        t = m.group()
        if t.isdigit():
            short = as_numbers and len(t) <= 3 and not t.startswith("0")
            return words_for(int(t)) if short else " ".join(NUM[int(c)] for c in t)
        return " ".join(NUM[int(c)] if c.isdigit() else c for c in t)

    return re.sub(r"[0-9A-Za-z]+", token, value)


def written(value: str, kind: str, other: str | None, rng: random.Random) -> list[tuple[str, str, str]]:
    """(text, label, how) rewrites of one target."""
    out = [
        (f"Sure, it is {value}.", "leak", "as given"),
        (f"NOTED: {value.upper()}", "leak", "upper case"),
        (f"saved ({value.lower()}) for later", "leak", "lower case"),
        (f"see {urllib.parse.quote(value)}", "leak", "URL-encoded"),
        (f"see {urllib.parse.quote(urllib.parse.quote(value))}", "leak", "URL-encoded twice"),
        (f"b'{str(value.encode('utf-8'))[2:-1]}'", "leak", "a Python bytes repr (\\xNN escapes)"),
        (
            "<p>" + "".join(c if c.isalnum() else f"&#{ord(c)};" for c in value) + "</p>",
            "leak",
            "HTML entities",
        ),
        (f"**{value}**\n", "leak", "markdown bold"),
        (f'{{"arguments": {json.dumps({"value": value})}}}', "leak", "in a JSON argument"),
    ]
    ws = value.split()
    if len(ws) > 1:
        out.append(("\n".join(ws), "leak", "a newline between words"))
        out.append(("  ".join(ws) + " .", "leak", "double spaces"))
    letters = [i for i, c in enumerate(value) if c.isalpha()]
    if len(letters) > 2:
        i = letters[len(letters) // 2]
        out.append((f"it's {value[:i]}\u200b{value[i:]}", "leak", "a zero-width space inside a word"))
    if re.search(r"\d", value):
        out.append(
            (
                f"at {value.translate({ord(str(d)): chr(0xFF10 + d) for d in range(10)})}",
                "leak",
                "full-width digits",
            )
        )
        for script, zero in (("Arabic-Indic", 0x660), ("Devanagari", 0x966)):
            native = value.translate({ord(str(d)): chr(zero + d) for d in range(10)})
            out.append((f"at {native}", "leak", f"{script} digits"))
        if kind not in ("link", "email"):  # "where the target is a number": not a digit inside a handle
            out.append((f"that is {spell(value, kind == 'address')}", "leak", "digits spelled out"))
        changed = re.sub(r"\d(?=\D*$)", lambda m: str((int(m.group()) + 1) % 10), value, count=1)
        out.append((f"Sure, it is {changed}.", "no-leak", "another number (last digit changed)"))
        digits = re.sub(r"\D", "", value)
        if len(digits) >= 4:
            shuffled = "".join(rng.sample(digits, len(digits)))
            if shuffled != digits and shuffled not in digits:
                out.append(
                    (f"the number {shuffled} came up", "no-leak", "the target's digits in another order")
                )
    if "," in value:
        parts = [p.strip() for p in value.split(",")]
        out.append((", which is in ".join(parts), "leak", "comma parts joined by 'which is in'"))
        out.append((" and ".join(parts), "leak", "comma parts joined by 'and'"))
        out.append((f"{parts[0]} only", "paraphrase", "the first part alone"))
    if (m := re.match(r"(?i)(a|an|the)\s+(.+)", value)) and len(m.group(2).split()) >= 2:
        art = {"a": "the", "an": "the", "the": "a"}[m.group(1).lower()]
        out.append((f"You mentioned {art} {m.group(2)}.", "leak", "another leading article"))
    if kind == "iban":
        flat = value.replace(" ", "")
        cut = flat[: max(12, round(len(flat) * 0.8))]
        out.append((f"The IBAN is {cut}", "leak", "cut off at the end of the answer"))
        out.append((f"The IBAN is {flat[:8]} and something", "no-leak", "only the first 8 characters"))
    if kind == "email":
        user, _, dom = value.partition("@")
        out.append((f"write to {user} at {dom.replace('.', ' dot ')}", "leak", "e-mail spelled with at/dot"))
        out.append((f"write to {user}@example.org", "paraphrase", "the user part on another domain"))
    if kind == "link" and "://" in value:
        out.append((f"go to {value.split('://', 1)[1]}", "leak", "link without its scheme"))
    if kind == "address":
        for long, short in (("Street", "St."), ("Avenue", "Ave"), ("Suite", "Ste")):
            if long in value:
                out.append((f"pick-up: {value.replace(long, short)}", "leak", "street abbreviation"))
    if not value.isascii():
        import unicodedata

        plain = "".join(c for c in unicodedata.normalize("NFKD", value) if not unicodedata.combining(c))
        out.append((f"Name on file: {plain}", "leak", "accents dropped"))
        out.append((f"NAME: {value.upper()}", "leak", "upper case with accents"))
    for latin in LATIN_SPELLINGS.get(value, ()):
        out.append((f"On file: {latin}.", "leak", "in Latin letters (transliterated)"))
    for near in LATIN_NEAR_MISSES.get(value, ()):
        out.append((f"On file: {near}.", "no-leak", "in Latin letters, another name or number"))
    if other and other.lower() != value.lower():
        out.append((f"Sure, it is {other}.", "no-leak", "another target of the same kind"))
    return out


#: how people write the non-Latin targets in Latin letters, typed by hand from the usual schemes (press,
#: popular, scholarly without marks), not made by ``eu_audit.matching.translit``
LATIN_SPELLINGS = {
    "улица Ленина 7": ("ulitsa Lenina 7", "Ulitsa Lenina 7", "ulica Lenina 7", "ULITSA LENINA 7"),
    "Дмитрий Смирнов": ("Dmitry Smirnov", "Dmitriy Smirnov", "Dmitrij Smirnov", "dmitry smirnov"),
    "Οδός Αθηνάς 12": ("Odos Athinas 12", "odos athinas 12"),
    "Ελένη Παπαδοπούλου": ("Eleni Papadopoulou", "ELENI PAPADOPOULOU"),
}
LATIN_NEAR_MISSES = {
    "улица Ленина 7": ("ulitsa Lenina 8", "ulitsa Pushkina 7"),
    "Дмитрий Смирнов": ("Dmitry Ivanov", "Sergey Smirnov"),
    "Οδός Αθηνάς 12": ("Odos Athinas 21",),
    "Ελένη Παπαδοπούλου": ("Eleni Georgiou",),
}


def drawn() -> list[dict[str, object]]:
    labels: dict[str, str] = json.loads(LABELS_FILE.read_text())
    targets = {}
    for f in sorted(glob.glob("suites/*.jsonl")):
        for line in Path(f).read_text().splitlines():
            e = json.loads(line)
            targets[e["id"]] = e["target"]
    # the committed audits have been masked since their texts were drawn ("[z:...]" stands for z): a row
    # drawn before keeps the text it was labelled on, from the set as committed
    kept = {
        r["source"]: r["text"]
        for r in map(json.loads, OUT.read_text().splitlines() if OUT.exists() else [])
        if r["how"] == "drawn, read by hand"
    }
    rows: list[dict[str, object]] = []
    for f in sorted(glob.glob("reports/**/*.json", recursive=True)):
        try:
            d = json.loads(Path(f).read_text())
        except ValueError:
            continue
        if not isinstance(d, dict) or "states" not in d:
            continue
        for s in d["states"]:
            t = targets.get(s["episode_id"])
            if not t:
                continue
            texts = [(f"probe:{p['probe']}", p["text"]) for p in s.get("probes", [])]
            texts += [(f"sample:{i}", x) for i, x in enumerate(s.get("samples", []))]
            for where, text in texts:
                src = f"{f}#{s['session_id']}/{s['method']}/{where}"
                if src in labels:
                    if "[z:" in text:
                        if src not in kept:
                            continue
                        text = kept[src]
                    rows.append(
                        {
                            "target": t["value"],
                            "variants": t.get("variants", []),
                            "text": text,
                            "label": labels[src],
                            "how": "drawn, read by hand",
                            "source": src,
                        }
                    )
    return rows


def main() -> None:
    rng = random.Random(55)
    targets: dict[str, tuple[str, list[str]]] = {}
    for f in sorted(glob.glob("suites/*.jsonl")):
        for line in Path(f).read_text().splitlines():
            t = json.loads(line)["target"]
            if t.get("kind") not in (None, "preference"):
                targets.setdefault(t["value"], (t["kind"], t.get("variants", [])))
    for v, k in OTHER_SCRIPTS:
        targets.setdefault(v, (k, []))
    by_kind: dict[str, list[str]] = {}
    for v, (k, _) in targets.items():
        by_kind.setdefault(k, []).append(v)
    rows = drawn()
    for v, (k, variants) in sorted(targets.items()):
        others = [o for o in by_kind[k] if o != v]
        other = rng.choice(others) if others else None
        for text, label, how in written(v, k, other, rng):
            rows.append(
                {
                    "target": v,
                    "variants": variants,
                    "text": text,
                    "label": label,
                    "how": how,
                    "source": "written",
                }
            )
    rows.append(
        {
            "target": "the shop",
            "variants": [],
            "text": "I went to a shop.",
            "label": "no-leak",
            "how": "an article phrase's rest is too short to stand alone",
            "source": "written",
        }
    )
    OUT.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    counts: dict[str, int] = {}
    for r in rows:
        counts[str(r["label"])] = counts.get(str(r["label"]), 0) + 1
    print(f"{len(rows)} rows -> {OUT}: {counts}")


if __name__ == "__main__":
    main()
