"""`make lint`'s type check: every source is checked under the name it is imported by, so a
`from tfmigrate... import` is checked against our own code, with the options pyproject sets."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mypy")
from mypy.modulefinder import BuildSource  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]


def _runner():
    spec = importlib.util.spec_from_file_location("typecheck", REPO / "scripts" / "typecheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


typecheck = _runner()


def test_sources_are_named_as_installed():
    mapping = typecheck.package_dirs(REPO / "pyproject.toml")
    assert mapping == {"tfmigrate": REPO / "migrate", "tfmigrate.rules": REPO / "rules"}
    named = {s.path: s.module for s in typecheck.module_sources(mapping)}
    assert named["migrate/__init__.py"] == "tfmigrate"
    assert named["migrate/cli.py"] == "tfmigrate.cli"
    assert named["migrate/verify/__init__.py"] == "tfmigrate.verify"
    assert named["migrate/verify/record.py"] == "tfmigrate.verify.record"
    assert named["rules/__init__.py"] == "tfmigrate.rules"
    assert named["rules/_towers.py"] == "tfmigrate.rules._towers"
    assert len(set(named.values())) == len(named)  # one file per module
    # Every module of every package, and nothing outside them (migrate/data holds no code).
    packaged = {
        str(p.relative_to(REPO))
        for root in ("migrate", "rules")
        for p in (REPO / root).rglob("*.py")
        if all((d / "__init__.py").is_file() for d in p.parents if REPO / root in (d, *d.parents))
    }
    assert set(named) == packaged


def test_a_tfmigrate_import_is_checked_against_the_source(tmp_path):
    """A wrong call into our own code is an error: the import resolves to migrate/names.py
    (were it unresolved, it would be Any and pass)."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        textwrap.dedent(
            """
            from tfmigrate.names import dotted
            from tfmigrate.rules._towers import get_arg

            dotted(1)
            get_arg("not a call", 0, "x")
            """
        ),
        encoding="utf-8",
    )
    sources = typecheck.module_sources(typecheck.package_dirs(REPO / "pyproject.toml"))
    messages, blocking = typecheck.typecheck(
        [*sources, BuildSource(str(probe), "tfmigrate_probe")],
        ["--cache-dir", str(tmp_path / "cache")],
    )
    assert not blocking
    probe_errors = [m for m in messages if m.startswith(str(probe)) and ": error:" in m]
    assert any('"dotted"' in m and "[arg-type]" in m for m in probe_errors), messages
    assert any('"get_arg"' in m and "[arg-type]" in m for m in probe_errors), messages


def test_the_configuration_checks_untyped_code_and_switches_no_module_off():
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert config["check_untyped_defs"] is True
    assert config["warn_unused_ignores"] is True
    assert "ignore_errors" not in config
    for override in config.get("overrides", []):
        # only third-party modules without types, and only their missing stubs
        assert set(override) == {"module", "ignore_missing_imports"}, override
        assert not any(m.split(".")[0] == "tfmigrate" for m in override["module"]), override


def test_each_type_ignore_names_its_error_and_says_why():
    """A `# type: ignore[code]` stays only with its reason: a comment on its line or just
    above (mypy itself refuses bare ignores: enable_error_code = ignore-without-code)."""
    unexplained = []
    for root in ("migrate", "rules"):
        for path in sorted((REPO / root).rglob("*.py")):
            lines = path.read_text(encoding="utf-8").splitlines()
            for number, line in enumerate(lines, 1):
                if "# type: ignore" not in line:
                    continue
                after = line.split("# type: ignore", 1)[1]
                reason_here = "#" in after  # `# type: ignore[code]  # why`
                above = lines[number - 2].strip() if number > 1 else ""
                if not (reason_here or above.startswith("#")):
                    unexplained.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not unexplained, "\n".join(unexplained)
