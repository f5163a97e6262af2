"""README's rule table is the catalog, generated; it may not drift."""

from __future__ import annotations

import re
from pathlib import Path

from tfmigrate.cli import rules_markdown

REPO = Path(__file__).resolve().parents[1]


def test_readme_rule_table_is_current():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- rules-table:[^\n]*-->\n(.*?)<!-- end rules-table -->", readme, re.S)
    assert match, "README lost its rules-table markers"
    assert match.group(1) == rules_markdown(), "regenerate: scripts/update_readme.py"
