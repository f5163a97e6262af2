"""SARIF 2.1.0 for GitHub code scanning, built as plain JSON."""

from __future__ import annotations

from tfmigrate import __version__
from tfmigrate.processing import FileResult
from tfmigrate.rule import Rule

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _rule_descriptor(rule: type[Rule]) -> dict[str, object]:
    sections = rule.doc_sections()
    help_text = "\n\n".join(f"{k}\n{v}" for k, v in sections.items())
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": sections.get("What it does", rule.summary)},
        "help": {"text": help_text, "markdown": rule.docs()},
        "properties": {"fix-safety": rule.fix_safety.value},
        "defaultConfiguration": {"level": "warning"},
    }


def to_sarif(results: list[FileResult], rules: tuple[type[Rule], ...]) -> dict[str, object]:
    index = {rule.code: i for i, rule in enumerate(rules)}
    sarif_results: list[dict[str, object]] = []
    notifications: list[dict[str, object]] = []
    for result in results:
        for finding in result.findings:
            region: dict[str, object] = {"startLine": finding.line, "startColumn": finding.col}
            message = finding.message
            if finding.cell is not None:
                message = f"cell {finding.cell}: {message}"
            entry: dict[str, object] = {
                "ruleId": finding.code,
                "level": "warning",
                "message": {"text": message},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": {"uri": result.path},
                            "region": region,
                        }
                    }
                ],
            }
            if finding.rewritten:
                # The region counts lines of the rewritten file, which the tool wrote or proposed.
                entry["properties"] = {"rewritten": True}
            if finding.code in index:
                entry["ruleIndex"] = index[finding.code]
            sarif_results.append(entry)
        if result.error:
            notifications.append(
                {
                    "level": "error",
                    "message": {"text": f"{result.path}: {result.error}"},
                    "locations": [{"physicalLocation": {"artifactLocation": {"uri": result.path}}}],
                }
            )
    return {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "tfmigrate",
                        "version": __version__,
                        "informationUri": "https://pypi.org/project/tfmigrate/",
                        "rules": [_rule_descriptor(rule) for rule in rules],
                    }
                },
                "results": sarif_results,
                "invocations": [
                    {
                        "executionSuccessful": not notifications,
                        "toolExecutionNotifications": notifications,
                    }
                ],
            }
        ],
    }
