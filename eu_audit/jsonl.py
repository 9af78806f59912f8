"""Validated JSONL reading and atomic writing, shared by bundles, suites and probes."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from eu_audit.errors import BadInput


def describe_validation_error(exc: ValidationError, tag: object = None) -> tuple[str, str]:
    """(field path, message) of the first error, e.g. ('block.turn', 'Input should be a valid integer').
    ``tag`` is the record's discriminator value, which pydantic puts first in the error location."""
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ())]
    if len(loc) > 1 and tag is not None and loc[0] == str(tag):
        loc = loc[1:]
    return ".".join(loc) or "(record)", err.get("msg", "invalid")


#: inputs larger than this are refused (a safety bound, not a format limit); EU_AUDIT_MAX_INPUT_MB raises it
MAX_INPUT_MB_ENV = "EU_AUDIT_MAX_INPUT_MB"
DEFAULT_MAX_INPUT_MB = 4096  # LongMemEval's largest file is ~2.7 GB
#: one line larger than this is refused before it is held in memory whole; EU_AUDIT_MAX_LINE_MB raises it
MAX_LINE_MB_ENV = "EU_AUDIT_MAX_LINE_MB"
DEFAULT_MAX_LINE_MB = 256  # a session's block with a whole book in it is still far below
MAX_DEPTH = 64  # no record nests deeper than a dozen levels
MAX_DIGITS = 19  # every integer in a record fits in 64 bits

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(rb"[\[\]{}]")
_LONG_NUMBER = re.compile(rb"\d{%d,}|[eE][+-]?\d{4,}" % (MAX_DIGITS + 1))
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abAB]", re.IGNORECASE)


def _mib(env: str, default: int) -> int:
    raw = os.environ.get(env)
    try:
        mb = int(raw) if raw else default
    except ValueError:
        raise BadInput(f"{env}={raw!r} is not a whole number of MiB") from None
    return mb << 20


def max_input_bytes() -> int:
    return _mib(MAX_INPUT_MB_ENV, DEFAULT_MAX_INPUT_MB)


def max_line_bytes() -> int:
    return _mib(MAX_LINE_MB_ENV, DEFAULT_MAX_LINE_MB)


def check_input_file(path: Path) -> int:
    """Refuse, before reading, anything that is not a regular file of a sane size: a FIFO or a device
    would block or never end. Returns the size."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise BadInput("no such file", path=str(path)) from None
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror}", path=str(path)) from None
    if stat.S_ISDIR(st.st_mode):
        raise BadInput("is a directory, expected a JSONL file", path=str(path))
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device or socket"
        raise BadInput(f"is {kind}, not a regular file; eu-audit reads only regular files", path=str(path))
    cap = max_input_bytes()
    if st.st_size > cap:
        raise BadInput(
            f"is {st.st_size >> 20} MiB, over the {cap >> 20} MiB limit for inputs "
            f"(set {MAX_INPUT_MB_ENV} to raise it)",
            path=str(path),
        )
    return st.st_size


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_line(raw: bytes) -> Any:
    """One JSON value from one line, bounded: nesting depth, number sizes, no NaN / Infinity, no text
    that cannot be written back (lone surrogates, escaped or as raw bytes), bytes that are not UTF-8.
    Raises ValueError with what is wrong."""
    try:
        raw.decode("utf-8")  # strict: json.loads would let encoded surrogates through
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 at byte {exc.start} ({exc.reason})") from None
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH or _LONG_NUMBER.search(raw):
        bare = _STRING.sub(b'""', raw)  # strings may hold anything; look at the structure only
        depth = deepest = 0
        for m in _BRACKETS.finditer(bare):
            depth += 1 if m.group() in (b"[", b"{") else -1
            deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            raise ValueError(f"nested {deepest} levels deep (at most {MAX_DEPTH})")
        if long := _LONG_NUMBER.search(bare):
            raise ValueError(f"a number too large for a record ({long.group()[:24].decode()}...)")
    try:
        obj = json.loads(raw, parse_constant=_no_constants)
    except RecursionError:
        raise ValueError(f"nested too deep (at most {MAX_DEPTH} levels)") from None
    if _SURROGATE_ESCAPE.search(raw):
        _check_encodable(obj)
    return obj


def _check_encodable(obj: Any) -> None:
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            check_text(x)
        elif isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)


def check_text(text: str, what: str = "text") -> str:
    """Text that UTF-8 cannot encode (a lone surrogate) is refused where it enters, not after the compute
    when an output is written."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} holds a character UTF-8 cannot encode (a lone surrogate at {exc.start})"
        ) from None
    return text


def iter_jsonl(path: Path, adapter: TypeAdapter[Any]) -> Iterator[tuple[int, Any]]:
    """Yield (line number, validated model) for each line; BadInput names file, line and field."""
    check_input_file(path)
    cap, read, line_cap = max_input_bytes(), 0, max_line_bytes()
    with open(path, "rb") as f:
        for lineno, raw in enumerate(iter(lambda: f.readline(line_cap + 1), b""), 1):
            if len(raw) > line_cap:
                raise BadInput(
                    f"a line over {line_cap >> 20} MiB (set {MAX_LINE_MB_ENV} to raise the limit)",
                    path=str(path),
                    line=lineno,
                )
            read += len(raw)
            if read > cap:  # the file grew while we read it
                raise BadInput(
                    f"grew past the {cap >> 20} MiB limit while being read", path=str(path), line=lineno
                )
            if not raw.strip():
                raise BadInput("empty line", path=str(path), line=lineno)
            try:
                obj = parse_line(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                hint = " (the file looks truncated)" if not raw.endswith(b"\n") else ""
                raise BadInput(f"not valid JSON: {exc}{hint}", path=str(path), line=lineno) from None
            except ValueError as exc:
                raise BadInput(str(exc), path=str(path), line=lineno) from None
            try:
                yield lineno, adapter.validate_python(obj)
            except ValidationError as exc:
                tag = obj.get("type") if isinstance(obj, dict) else None
                fld, msg = describe_validation_error(exc, tag)
                raise BadInput(msg, path=str(path), line=lineno, field=fld) from None


def dump_line(model: BaseModel) -> str:
    return model.model_dump_json() + "\n"


_TMP_SUFFIX = ".eu-audit.tmp"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_temps(path: Path) -> None:
    """Remove temporary files an earlier, killed writer of ``path`` left behind (its pid is in the name
    and no longer runs)."""
    with contextlib.suppress(OSError):
        for p in path.parent.glob(f".{glob.escape(path.name)}.*{_TMP_SUFFIX}"):
            pid = p.name[len(path.name) + 2 :].split(".", 1)[0]
            if pid.isdigit() and not _pid_alive(int(pid)):
                with contextlib.suppress(OSError):
                    p.unlink()


def temp_beside(path: Path) -> tuple[int, str]:
    """A private temporary file next to ``path`` (same file system, so the final rename is atomic),
    named so a later run can tell whose it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temps(path)
    return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=_TMP_SUFFIX)


#: set when SIGTERM or SIGINT reached this process (``interrupt_on_sigterm``): a person or a supervisor
#: asked it to stop, as against a KeyboardInterrupt raised by code
SIGNALLED = threading.Event()


def interrupt_on_sigterm() -> None:
    """Turn SIGTERM into KeyboardInterrupt, as ^C is, so writers unwind and delete their temporary files;
    either signal is noted in ``SIGNALLED``."""

    def _raise(signum: int, frame: object) -> None:
        SIGNALLED.set()
        raise KeyboardInterrupt

    with contextlib.suppress(ValueError):  # not in the main thread: leave the default
        signal.signal(signal.SIGTERM, _raise)
        signal.signal(signal.SIGINT, _raise)


@contextlib.contextmanager
def atomic_writer(path: Path, *, private: bool = True) -> Iterator[Any]:
    """Write to a temp file in the same folder, fsync, then rename over ``path``: a reader never sees
    a half-written file. ``private`` creates it with mode 0600 (bundles hold the targets)."""
    fd, tmp = temp_beside(path)
    try:
        os.fchmod(fd, 0o600 if private else 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_jsonl(path: Path, models: Iterable[BaseModel], *, private: bool = True) -> None:
    with atomic_writer(path, private=private) as f:
        for m in models:
            f.write(dump_line(m))


def check_output_path(path: Path, *, force: bool | None = None) -> None:
    """Refuse, before any work, an output that could not be written: a folder, a parent that is a file,
    a parent folder that does not exist and cannot be made, or one we may not write to; with ``force``
    given, an existing file too unless it is True (eu-audit never overwrites silently)."""
    path = Path(path)
    if force is False and path.exists() and not path.is_dir():
        raise BadInput(
            "exists; pass --force to replace it (eu-audit never overwrites silently)", path=str(path)
        )
    if path.is_dir():
        raise BadInput("is a directory; give a file name for the output", path=str(path))
    parent = path.parent
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise BadInput(f"cannot write here: {probe} is a file, not a folder", path=str(path))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise BadInput(f"cannot write here: the folder {probe} is not writable", path=str(path))
    if path.exists() and not os.access(path, os.W_OK) and not os.access(parent, os.W_OK):
        raise BadInput("the output exists and cannot be replaced", path=str(path))


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows as a Parquet data set (``datasets``), written atomically and privately."""
    from datasets import Dataset

    path = Path(path)
    fd, tmp = temp_beside(path)
    os.close(fd)
    try:
        Dataset.from_list(rows).to_parquet(tmp)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
