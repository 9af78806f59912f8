"""The command line: one module per command over the library's public API (``eu_audit.cli.app`` holds
the app, the shared option types and the exit-code contract: 0 held, 1 failed, 2 bad input, 3 the run
failed, 4 inconclusive)."""

import importlib

from eu_audit.cli.app import EXIT_CODES, app, main

#: the command modules, in the order ``--help`` lists them (each registers its command on the app)
COMMANDS = (
    "gate",
    "record",
    "unlearn",
    "inspect_bundle",
    "models",
    "schema",
    "audit",
    "merge",
    "verify",
    "power",
    "matcher",
    "rescore",
    "sweep",
    "report",
    "view",
    "serve",
    "agent",
    "suites",
    "pack",
    "plugins",
)
for _name in COMMANDS:
    importlib.import_module(f"eu_audit.cli.{_name}")

__all__ = ["COMMANDS", "EXIT_CODES", "app", "main"]
