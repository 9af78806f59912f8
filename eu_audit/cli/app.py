"""The CLI's shared parts: the Typer app, the consoles, the progress bar, the exit-code contract and the
option types several commands use. Each command lives in a module of its own beside this one."""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from eu_audit import __version__
from eu_audit.errors import EuAuditError
from eu_audit.jsonl import SIGNALLED, interrupt_on_sigterm
from eu_audit.parallel import abandoned

app = typer.Typer(
    name="eu-audit",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    help="Prove whether an LLM agent really forgets: record agent sessions on a local KV engine, apply "
    "forget methods, audit what is left.\n\nExit codes: 0 ok, 1 a gate failed, 2 bad input, 3 run failed, "
    "4 a gate is inconclusive at this n.",
)
suites_app = typer.Typer(help="List, show and build episode suites.", no_args_is_help=True)
app.add_typer(suites_app, name="suites")
#: the width of a table printed into a log or a pipe (a CI job's output, `record ... > run.log`), where rich
#: would fall back to 80 columns and wrap a seven-column table into a column of fragments; COLUMNS overrides
LOG_COLUMNS = 160


def console(stderr: bool = False) -> Console:
    """A console as wide as its terminal, or ``LOG_COLUMNS`` wide when it writes to a file or a pipe (rich's
    own terminal test, the one the progress bar reads, so the two never disagree)."""
    made = Console(stderr=stderr)
    if not made.is_terminal and "COLUMNS" not in os.environ:
        made.width = LOG_COLUMNS
    return made


out = console()
err = console(stderr=True)
#: 0 held, 1 a gate failed, 2 bad input, 3 the run failed, 4 a gate is inconclusive at this n
EXIT_CODES = (0, 1, 2, 3, 4)
DEBUG_ENV = "EU_AUDIT_DEBUG"  # set to 1 (or pass --debug) to see the traceback of a failed run


def say(console: Console, *parts: str | Text, wrap: bool = True) -> None:
    """Print text that may hold user-controlled strings (paths, ids, rules): never parsed as markup.
    ``wrap=False`` leaves the line whole (the terminal folds it on screen): a path or a ``file:line`` in
    it stays one string a user can copy and a log search can find."""
    console.print(Text.assemble(*parts), highlight=False, soft_wrap=not wrap)


#: without a terminal (CI logs, ``> file``) progress is printed as plain lines, at most one per this many s
PLAIN_PROGRESS_EVERY_S = 15.0


@contextlib.contextmanager
def progress_bar() -> Iterator[Callable[[str, int, int], None]]:
    """A Rich progress bar on stderr; yields the ``progress(what, done, total)`` callback. When stderr is not
    a terminal a bar cannot draw, and a long run would print nothing for half an hour: there the progress
    is one plain line when work completes, at most every ``PLAIN_PROGRESS_EVERY_S`` and at the end."""
    if not err.is_terminal:
        yield _plain_progress()
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as prog:
        task = prog.add_task("loading model", total=None)

        def report(what: str, done: int, total: int) -> None:
            # the description is rendered as markup: escape user-controlled ids
            from rich.markup import escape

            prog.update(task, description=escape(what), completed=done, total=total)

        yield report


def _plain_progress() -> Callable[[str, int, int], None]:
    start = time.monotonic()
    last = {"at": -PLAIN_PROGRESS_EVERY_S, "done": -1}

    def report(what: str, done: int, total: int) -> None:
        now = time.monotonic()
        finished = total > 0 and done >= total
        if done == last["done"] or not (finished or now - last["at"] >= PLAIN_PROGRESS_EVERY_S):
            return
        last.update(at=now, done=done)
        elapsed = int(now - start)
        say(err, f"[{elapsed // 60}:{elapsed % 60:02d}] {done}/{total} {what}")

    return report


def _version(value: bool) -> None:
    if value:
        out.print(f"eu-audit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help=f"Print the traceback when a run fails (or set {DEBUG_ENV}=1).")
    ] = False,
) -> None:
    if debug:
        os.environ[DEBUG_ENV] = "1"


#: shared by audit and unlearn: the key that signs a receipt
SigningKey = Annotated[
    Path | None,
    typer.Option(
        help="The receipt's ed25519 private key (PEM; make a pair with: openssl genpkey -algorithm ed25519 "
        "-out key.pem && openssl pkey -in key.pem -pubout -out key.pub.pem)."
    ),
]
#: shared by every command that writes files: an existing output is replaced only when asked (never an input)
Force = Annotated[
    bool, typer.Option(help="Replace existing outputs (files, and record's state folder); never an input.")
]


#: shared by record and audit: a deterministic split of the sessions (see eu_audit/shards.py)
ShardOption = Annotated[
    str | None,
    typer.Option(
        help="Run only shard I of N (session i when i mod N = I-1; ids and seeds stay run-wide); join the "
        "shards with `eu-audit merge`.",
        metavar="I/N",
    ),
]


#: shared by record and gate: a contiguous slice of each suite's sessions (see eu_audit/shards.py)
SessionsOption = Annotated[
    str | None,
    typer.Option(
        "--sessions",
        help="Run only each suite's sessions FROM to TO-1 of a run of --n (ids and seeds as in that run): "
        "a long run in slices, or a finished one continued to a larger --n; join the slices' audits with "
        "`eu-audit merge`.",
        metavar="FROM:TO",
    ),
]


def fail(exc: BaseException, message: str, code: int) -> None:
    say(err, Text("error: ", style="bold red"), message, wrap=False)
    if os.environ.get(DEBUG_ENV):
        err.print("".join(traceback.format_exception(exc)), markup=False, highlight=False)
    leave(code)


def leave(code: int) -> None:
    """Exit with ``code``. A run stopped by a signal that left jobs running (``parallel.abandoned``: a
    tenant waiting on a slow agent) ends here, its outputs written, without joining their threads, which
    would hold the process until the agent answered: a stop is within seconds, as promised."""
    if abandoned.is_set() and SIGNALLED.is_set():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


_KEEP_BREAK_BEFORE = ("[bold]eu-audit", "eu-audit ", "- ", "* ", "  ")


def reflow(doc: str) -> str:
    """A docstring as --help should show it: typer's rich mode keeps every source line break, so a line
    written for a 110-column file wraps twice at 80. Paragraphs keep their lines joined; a line that
    starts a command example or a list item keeps its own line."""
    paragraphs = []
    for par in inspect.cleandoc(doc).split("\n\n"):
        if par.startswith("\b"):  # click's mark for a paragraph kept as written
            paragraphs.append(par)
            continue
        lines = par.split("\n")
        joined = [lines[0]]
        for line in lines[1:]:
            if line.startswith(_KEEP_BREAK_BEFORE):
                joined.append(line)
            else:
                joined[-1] += " " + line
        paragraphs.append("\n".join(joined))
    return "\n\n".join(paragraphs)


def _reflow_commands(typer_app: typer.Typer) -> None:
    for cmd in typer_app.registered_commands:
        if cmd.callback is not None and cmd.callback.__doc__:
            cmd.callback.__doc__ = reflow(cmd.callback.__doc__)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _reflow_commands(group.typer_instance)


#: the code typer returns (not raises) for a KeyboardInterrupt when not in standalone mode
INTERRUPTED = 130


def main() -> None:
    """Run the CLI under the one exit-code contract: 0 ok, 1 a gate failed, 2 bad input, 3 run failed,
    4 a gate is inconclusive.
    Nothing else leaves this function: an unexpected error is a failed run (3), one line, and its
    traceback with --debug or EU_AUDIT_DEBUG=1."""
    interrupt_on_sigterm()  # a kill unwinds like ^C, so no temporary file is left behind
    _reflow_commands(app)
    try:
        rc = app(standalone_mode=False)
    except EuAuditError as exc:
        fail(exc, str(exc), exc.exit_code)
    except (KeyboardInterrupt, typer.Abort) as exc:
        fail(exc, "interrupted; outputs are written atomically, so nothing half-written was left", 3)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 3
        sys.exit(code if code in EXIT_CODES else 3)
    except Exception as exc:
        # Usage errors (typer vendors click: match by shape, not by class path).
        if hasattr(exc, "show") and isinstance(getattr(exc, "exit_code", None), int):
            exc.show()
            sys.exit(2)
        fail(exc, f"the run failed: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", 3)
    if rc == INTERRUPTED:  # typer turns ^C and SIGTERM into this code: never a success, never a verdict
        fail(
            KeyboardInterrupt(),
            "interrupted; outputs are written atomically, so nothing half-written was left",
            3,
        )
    sys.exit(0 if rc is None else rc if isinstance(rc, int) and rc in EXIT_CODES else 3)
