"""Every rule's VALID/INVALID examples run as tests (Fixit style), and every rule is documented."""

from __future__ import annotations

import pytest

from tfmigrate.engine import Settings, process_source
from tfmigrate.registry import all_rules
from tfmigrate.rule import FixSafety

RULES = all_rules()


def _cases(kind: str):
    for rule in RULES:
        for index, example in enumerate(getattr(rule, kind)):
            yield pytest.param(rule, example, id=f"{rule.code}-{kind}-{index}")


@pytest.mark.parametrize(("rule", "code"), list(_cases("valid")))
def test_valid_example_has_no_finding(rule, code):
    result = process_source(code, "example.py", Settings(rules=(rule,)))
    assert result.error is None
    assert [f.code for f in result.findings] == []


@pytest.mark.parametrize(("rule", "example"), list(_cases("invalid")))
def test_invalid_example_is_flagged_and_fixed(rule, example):
    scan = process_source(example.code, "example.py", Settings(rules=(rule,)))
    assert scan.error is None
    assert rule.code in [f.code for f in scan.findings]
    if example.message is not None:
        assert any(example.message in f.message for f in scan.findings)

    fixed = process_source(
        example.code, "example.py", Settings(rules=(rule,), fix=True, unsafe_fixes=True)
    )
    assert fixed.error is None
    if example.fixed is None:
        assert fixed.new_code is None, "an example without `fixed` must not be changed"
        return
    assert fixed.new_code == example.fixed
    # Idempotent: the fixed code offers no further fix.
    again = process_source(
        fixed.new_code, "example.py", Settings(rules=(rule,), fix=True, unsafe_fixes=True)
    )
    assert again.new_code is None


@pytest.mark.parametrize("rule", RULES, ids=[r.code for r in RULES])
def test_rule_is_documented(rule):
    assert rule.code.startswith("TFM") and len(rule.code) == 6
    assert rule.name and rule.name == rule.name.lower()
    assert rule.summary
    assert rule.missing_doc_sections() == []
    assert rule.invalid, "every rule needs at least one INVALID example"
    assert rule.valid, "every rule needs at least one VALID example"
    if rule.fix_safety is not FixSafety.MANUAL:
        assert any(e.fixed for e in rule.invalid), "a fixing rule shows its fix"


def test_codes_and_names_are_unique():
    assert len({r.code for r in RULES}) == len(RULES)
    assert len({r.name for r in RULES}) == len(RULES)


def test_unsafe_fix_needs_opt_in():
    rule = next(r for r in RULES if r.code == "TFM104")
    example = rule.invalid[0]
    safe_only = process_source(example.code, "example.py", Settings(rules=(rule,), fix=True))
    assert safe_only.new_code is None
    assert [f.applied for f in safe_only.findings] == [False]
