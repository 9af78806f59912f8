"""What a file's bytes say, read the way the agent may have written z: forensics' second look.

``forensics._bytes`` finds z's exact bytes (UTF-8, UTF-16). An agent writes z in other forms too, none of
them a bug it would notice: ``json.dump`` escapes every non-ASCII letter (``\\u00e9``), a text normalised
to NFD splits an accent from its letter, a line wrap puts a newline inside z, a cache compresses its
records (gzip, zlib, zstd), a blob keeps z base64-encoded. This module reads those forms:

- ``text_places``: runs of text in the raw bytes (live or deleted: a free page, a WAL frame), folded as
  the matcher folds (escapes, entities, NFD, case, spacing) and then decoded as the residue reader decodes
  a request (``eu_audit.matching.decoders``: base64, hex, percent, escapes, look-alike letters, reversed);
- ``compressed_places``: every gzip, zlib or zstd stream that starts in the bytes, opened (bounded), and
  its text read the same way.

Each place is a byte offset and how z was written there, so a finding names the file and the byte (a
database's page, a WAL's frame) as the exact search does.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator

import zstandard

from eu_audit.matching import TargetMatcher
from eu_audit.matching.decoders import found_encoded

#: a run of bytes that may be text: no NUL and no control byte other than tab and line ends, 6+ long
_RUN = re.compile(rb"[^\x00-\x08\x0e-\x1f]{6,}")
#: what opening a false magic raises
_NOT_A_STREAM = (zlib.error, ValueError, zstandard.ZstdError)
#: the magic numbers of the compressed streams opened: gzip, zlib (each compression level's header), zstd
_MAGIC = re.compile(rb"\x1f\x8b\x08|\x78[\x01\x5e\x9c\xda]|\x28\xb5\x2f\xfd")
#: the most a stream is inflated to, and the most streams tried per file (a file of random bytes has
#: many false magics; each costs a failed start only)
MAX_INFLATED = 16 << 20
MAX_STREAMS = 4096
#: files larger than this get the exact search only (folding is Python per character)
MAX_FOLDED_BYTES = 64 << 20


def _runs(raw: bytes) -> Iterator[tuple[int, str]]:
    for m in _RUN.finditer(raw):
        yield m.start(), m.group().decode("utf-8", errors="replace")


def _read_as(text: str, matcher: TargetMatcher) -> str:
    """How ``text`` holds z: "folded" (as the matcher reads it), a decoder's name, or "" (it does not)."""
    if matcher.found_in(text):
        return "folded"
    return found_encoded(matcher.found_in, text)


def text_places(raw: bytes, matcher: TargetMatcher, skip: set[int]) -> list[tuple[int, str]]:
    """(byte offset, how) of each run of text in ``raw`` that holds z in a form the exact search does not
    see; a run that holds an offset in ``skip`` (found exactly already) is not counted again."""
    if len(raw) > MAX_FOLDED_BYTES:
        return []
    out = []
    for at, text in _runs(raw):
        end = at + len(text.encode("utf-8", errors="replace"))
        if any(at <= s < end for s in skip):
            continue
        how = _read_as(text, matcher)
        if how:
            out.append((at, how))
    return out


def _inflate(raw: bytes, at: int) -> bytes | None:
    """The stream starting at ``at`` opened, or None where it is not one (a false magic)."""
    try:
        if raw.startswith(b"\x28\xb5\x2f\xfd", at):
            reader = zstandard.ZstdDecompressor().decompressobj()
            return reader.decompress(raw[at : at + MAX_INFLATED])[:MAX_INFLATED] or None
        d = zlib.decompressobj(31 if raw.startswith(b"\x1f\x8b", at) else 15)
        out = d.decompress(raw[at:], MAX_INFLATED)
        return out if out and (d.eof or len(out) >= MAX_INFLATED) else None
    except _NOT_A_STREAM:
        return None


def compressed_places(raw: bytes, matcher: TargetMatcher) -> list[tuple[int, str]]:
    """(byte offset, how) of each compressed stream in ``raw`` whose text holds z."""
    if len(raw) > MAX_FOLDED_BYTES:
        return []
    out = []
    names = {b"\x1f": "gzip", b"\x78": "zlib", b"\x28": "zstd"}
    for n, m in enumerate(_MAGIC.finditer(raw)):
        if n >= MAX_STREAMS:
            break
        inflated = _inflate(raw, m.start())
        if not inflated:
            continue
        for _, text in _runs(inflated):
            how = _read_as(text, matcher)
            if how:
                kind = names[raw[m.start() : m.start() + 1]]
                out.append((m.start(), f"in a {kind} stream" + ("" if how == "folded" else f", {how}")))
                break
    return out


def blob_text(value: bytes) -> str:
    """A BLOB cell's text: opened first where it is a compressed stream (a cache's record), then read as
    UTF-8 (serialized records, msgpack and JSON blobs keep their strings as UTF-8 runs among other
    bytes)."""
    if _MAGIC.match(value):
        value = _inflate(value, 0) or value
    return value.decode("utf-8", errors="replace")
