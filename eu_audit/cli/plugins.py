"""``eu-audit plugins``: the plug-ins installed and loaded, and what each added to which extension point."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from eu_audit.cli.app import app, out, say


@app.command("plugins")
def plugins_command() -> None:
    """List the installed plug-ins eu-audit loads (entry points of the group eu_audit.plugins and of each
    registry's own group), their distributions and versions, and every registry entry they define. An
    audit and its signed receipt name the same; EU_AUDIT_NO_PLUGINS=1 runs eu-audit on its built-ins alone.

    Example:

    [bold]eu-audit plugins[/]
    """
    from eu_audit.plugins import EXTENSION_POINTS, LOADED, NO_PLUGINS, added_by_plugins, plugins_off

    for point in EXTENSION_POINTS:
        point.resolve().load()  # every registry loads its groups: what a run could use
    if plugins_off():
        say(out, f"plug-ins are off ({NO_PLUGINS} is set): eu-audit runs on its built-ins alone")
        return
    if not LOADED:
        say(out, "no plug-in installed: eu-audit runs on its built-ins (docs/library.md says how to add one)")
        return
    table = Table(title="plug-ins loaded")
    for col in ("distribution", "entry point", "module", "defines"):
        table.add_column(col)
    added = added_by_plugins()
    for p in LOADED:
        mine = [entry for entry, by in added.items() if by == p.dist or by.startswith(p.module)]
        table.add_row(
            Text(p.dist or "-"), Text(f"{p.group}: {p.name}"), Text(p.module), Text(", ".join(mine) or "-")
        )
    out.print(table)
