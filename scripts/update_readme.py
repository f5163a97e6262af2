"""Regenerate README's rule table from the catalog: python scripts/update_readme.py"""

from __future__ import annotations

import re
from pathlib import Path

from tfmigrate.cli import rules_markdown

README = Path(__file__).resolve().parents[1] / "README.md"

text = README.read_text(encoding="utf-8")
new = re.sub(
    r"(<!-- rules-table:[^\n]*-->\n).*?(<!-- end rules-table -->)",
    lambda m: m.group(1) + rules_markdown() + m.group(2),
    text,
    flags=re.S,
)
README.write_text(new, encoding="utf-8")
