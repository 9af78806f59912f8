"""``python -m eu_audit.cli``."""

from eu_audit.cli.app import main

main()
