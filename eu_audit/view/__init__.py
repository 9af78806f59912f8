"""What a reader sees: ``eu-audit report``, a Markdown report with plots from sweep folders and audits
(``eu_audit.view.report``), and ``eu-audit view``, audits as a static HTML site (``eu_audit.view.site``)
from page data computed by ``eu_audit.view.pages``."""

from eu_audit.view.site import build_site, find_sources

__all__ = ["build_site", "find_sources"]
