"""Discover the rule catalog: every ``Rule`` subclass in the modules of ``tfmigrate.rules``.

The engine never names a rule; dropping a module into ``rules/`` is how a rule is added.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from tfmigrate.rule import Rule


@lru_cache(maxsize=1)
def all_rules() -> tuple[type[Rule], ...]:
    import tfmigrate.rules as package

    found: dict[str, type[Rule]] = {}
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, Rule)
                and value is not Rule
                and getattr(value, "code", None)
                and value.__module__ == module.__name__
            ):
                if value.code in found and found[value.code] is not value:
                    raise RuntimeError(f"rule code {value.code} is defined twice")
                found[value.code] = value
    return tuple(found[code] for code in sorted(found))


def rule_by_code(code: str) -> type[Rule] | None:
    code = code.upper()
    for rule in all_rules():
        if rule.code == code or rule.name == code.lower():
            return rule
    return None


def select_rules(
    select: list[str] | None = None, ignore: list[str] | None = None
) -> tuple[type[Rule], ...]:
    """Rules enabled by code prefixes (``TFM1`` selects all TFM1xx), like Ruff's selectors."""

    def matches(rule: type[Rule], selectors: list[str]) -> bool:
        return any(rule.code.startswith(s.upper()) or rule.name == s for s in selectors)

    rules = all_rules()
    if select:
        rules = tuple(r for r in rules if matches(r, select))
    else:
        rules = tuple(r for r in rules if r.default_enabled)
    if ignore:
        rules = tuple(r for r in rules if not matches(r, ignore))
    return rules


def unknown_selectors(selectors: list[str]) -> list[str]:
    codes = [r.code for r in all_rules()]
    names = [r.name for r in all_rules()]
    return [
        s for s in selectors if not any(c.startswith(s.upper()) for c in codes) and s not in names
    ]
