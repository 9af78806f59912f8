"""Error types that carry the CLI's exit-code contract.

0 ran and every gate held; 1 ran and a gate failed; 2 bad input or usage; 3 the run itself failed;
4 ran, no gate failed, but one is inconclusive at this n (more sessions would decide).
Library code raises these; the CLI turns them into one clear message and the matching exit code,
never a traceback for a user mistake.
"""

from __future__ import annotations


class EuAuditError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 3


class BadInput(EuAuditError):
    """The user gave us something we cannot use: a bad file, flag, name or value (exit 2)."""

    exit_code = 2

    def __init__(
        self, message: str, *, path: str | None = None, line: int | None = None, field: str | None = None
    ) -> None:
        self.path, self.line, self.field, self.message = path, line, field, message
        where = ""
        if path is not None:
            where = f"{path}"
            if line is not None:
                where += f":{line}"
            where += ": "
        if field:
            message = f"field '{field}': {message}"
        super().__init__(where + message)

    def located(self, path: str | None, line: int | None, context: str = "") -> BadInput:
        """This refusal, placed at ``path:line`` if it did not say where (a method refusing a session)."""
        if self.path is not None or path is None:
            return self
        return BadInput(f"{context}{self.message}", path=path, line=line, field=self.field)


class RunFailed(EuAuditError):
    """The run itself failed: a model that will not load, an engine error (exit 3)."""

    exit_code = 3


class CropUnsupported(BadInput):
    """The model's cache cannot be cropped exactly (sliding-window or recurrent layers)."""
