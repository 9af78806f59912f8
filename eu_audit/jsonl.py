"""Validated JSONL reading and atomic writing, shared by bundles, suites and probes."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
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


def iter_jsonl(path: Path, adapter: TypeAdapter[Any]) -> Iterator[tuple[int, Any]]:
    """Yield (line number, validated model) for each line; BadInput names file, line and field."""
    if not path.exists():
        raise BadInput("no such file", path=str(path))
    if path.is_dir():
        raise BadInput("is a directory, expected a JSONL file", path=str(path))
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                raise BadInput("empty line", path=str(path), line=lineno)
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                hint = " (the file looks truncated)" if not raw.endswith(b"\n") else ""
                raise BadInput(f"not valid JSON: {exc}{hint}", path=str(path), line=lineno) from None
            try:
                yield lineno, adapter.validate_python(obj)
            except ValidationError as exc:
                tag = obj.get("type") if isinstance(obj, dict) else None
                fld, msg = describe_validation_error(exc, tag)
                raise BadInput(msg, path=str(path), line=lineno, field=fld) from None


def dump_line(model: BaseModel) -> str:
    return model.model_dump_json() + "\n"


@contextlib.contextmanager
def atomic_writer(path: Path, *, private: bool = True) -> Iterator[Any]:
    """Write to a temp file in the same folder, fsync, then rename over ``path``: a reader never sees
    a half-written file. ``private`` creates it with mode 0600 (bundles hold the targets)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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


def check_output_path(path: Path) -> None:
    """Refuse, before any work, an output that could not be written: a folder, a parent that is a file,
    a parent folder that does not exist and cannot be made, or one we may not write to."""
    path = Path(path)
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
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        Dataset.from_list(rows).to_parquet(tmp)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
