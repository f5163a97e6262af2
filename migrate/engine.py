"""Run the enabled rules over one source text: findings, fixes, and a checked new text.

The pipeline per file: cheap pre-filter -> parse (libcst) -> resolve names -> run rules in one
batched traversal -> apply enabled fixes, repeat until stable -> re-parse and compile the output
(Black's safety check). Nothing here writes files.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath

import libcst as cst

from tfmigrate import prefilter, tree
from tfmigrate.names import NameResolver
from tfmigrate.python2 import describe_syntax_error
from tfmigrate.rule import Finding, Fix, FixSafety, Rule, RuleContext

# A file that mentions none of these cannot hold a pattern any rule looks for.
_MARKERS = (b"tensorflow", b"keras", b"tf_slim", b"horovod")
# A whole-program fix (TFM107, TFM303) takes a pass of its own; the rules it unblocks need more.
_MAX_FIX_PASSES = 8
_SUPPRESS = re.compile(r"#\s*tfmigrate:\s*ignore(?:\[([A-Za-z0-9_,\s-]+)\])?")
_SUPPRESS_BYTES = re.compile(rb"#\s*tfmigrate:\s*ignore")


@dataclass
class Settings:
    rules: tuple[type[Rule], ...]
    fix: bool = False  # compute and apply fixes (rewrite) or only report (scan)
    unsafe_fixes: bool = False
    options: dict[str, object] = field(default_factory=dict)

    def enabled(self, safety: FixSafety) -> bool:
        if not self.fix:
            return False
        return safety is FixSafety.SAFE or (safety is FixSafety.UNSAFE and self.unsafe_fixes)


@dataclass
class SourceResult:
    findings: list[Finding] = field(default_factory=list)
    new_code: str | None = None  # set only when the text changed
    new_bytes: bytes | None = None  # new_code in the file's own encoding (BOM kept)
    bindings: dict[str, str] = field(default_factory=dict)  # names this source binds
    error: str | None = None
    manifest: dict[str, object] = field(default_factory=dict)  # from the applied fixes


class RuleCrashed(Exception):
    pass


def mentions_tensorflow(data: bytes | str) -> bool:
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    return any(marker in raw for marker in _MARKERS)


def triggered_rules(source: bytes | str, rules: tuple[type[Rule], ...]) -> tuple[type[Rule], ...]:
    """The rules whose triggers could occur in ``source`` (a cheap test on its bytes)."""
    raw = source.encode("utf-8", "surrogateescape") if isinstance(source, str) else source
    found: dict[object, bool] = {}  # needle -> in raw, shared by the rules' triggers
    return tuple(
        rule
        for rule in rules
        if rule.triggers is None or prefilter.raw_possible(rule.triggers, raw, found)
    )


def check_syntax(source: bytes | str, path: str) -> str | None:
    """A one-line error for unparsable source, else None (fast: CPython's own parser)."""
    try:
        ast.parse(source, filename=path)
    except SyntaxError as exc:
        return describe_syntax_error(source, exc)
    except ValueError as exc:  # e.g. null bytes
        return f"cannot parse: {exc}"
    return None


def process_source(
    source: str | bytes,
    path: str,
    settings: Settings,
    inherited: dict[str, str] | None = None,
) -> SourceResult:
    """Findings (and, with ``settings.fix``, new text) for one Python source. ``inherited`` are
    bindings made before this source runs (earlier notebook cells)."""
    if not inherited and not mentions_tensorflow(source):
        return SourceResult(error=check_syntax(source, path))
    # A notebook cell may use names an earlier cell bound without spelling them: no byte test.
    rules = settings.rules if inherited else triggered_rules(source, settings.rules)
    if not rules and not inherited:
        return SourceResult(error=check_syntax(source, path))
    settings = replace(settings, rules=rules)
    first_pass = settings
    resolver = None
    facts = prefilter.code_facts(source, inherited) if prefilter.enabled() else None
    if facts is not None:
        # The light pass found the same bindings NameResolver would, and which rules can fire.
        if not facts.uses_any(prefilter.TF_ROOTS):
            return SourceResult(bindings=dict(facts.bindings))
        possible = prefilter.possible_rules(facts, rules, PurePosixPath(path))
        if not possible:
            return SourceResult(bindings=dict(facts.bindings))
        first_pass = replace(settings, rules=possible)
        resolver = _resolver_from(facts)
        facts.release()  # its ast nodes: not needed while libcst holds its own tree
    try:
        module = tree.parse_module(source)
    except cst.ParserSyntaxError as exc:
        return SourceResult(error=check_syntax(source, path) or _libcst_error(exc))

    # Fix passes run every triggered rule: a fix may write code another rule then fixes.
    findings, fixes, bindings = _run_rules(
        module, path, first_pass, inherited, resolver, _may_suppress(source)
    )
    result = SourceResult(findings=findings, bindings=bindings)
    if not fixes:
        return result

    new_module = module
    pending = fixes
    contributed: dict[str, object] = {}
    new_code: str | None = None  # new_module's text, once generated
    # Findings that only the fixed text has (a converted program's `.h5` save, an optimizer a
    # new train step builds): reported too, placed in the rewritten text.
    known = {(f.code, f.message) for f in findings}
    later: dict[tuple[str, str], Finding] = {}
    pass_findings: list[Finding] = []
    for _ in range(_MAX_FIX_PASSES):
        new_module, applied = _apply(new_module, pending)
        _mark_applied([*findings, *later.values()], applied)
        for _finding, fix in pending:
            if fix is not None and fix.manifest:
                contributed.update(fix.manifest)
        new_code = None
        pass_settings, pass_resolver, suppressible = settings, None, True
        if facts is not None:
            # The fixed text gets its own light pass: only rules that could report on it run.
            new_code = new_module.code
            pass_facts = prefilter.code_facts(new_code, inherited)
            if pass_facts is not None:
                pass_settings = replace(
                    settings,
                    rules=prefilter.possible_rules(pass_facts, settings.rules, PurePosixPath(path)),
                )
                pass_resolver = _resolver_from(pass_facts)
                pass_facts.release()
            suppressible = _may_suppress(new_code)
        pass_findings, pending, _ = _run_rules(
            new_module, path, pass_settings, inherited, pass_resolver, suppressible
        )
        for finding in pass_findings:
            key = (finding.code, finding.message)
            if key not in known and key not in later:
                finding.rewritten = True
                later[key] = finding
        if not pending:
            break
    original = _text_of(source, module)
    if new_code is None:
        new_code = new_module.code
    if new_code == original:
        return result
    problem = _safety_check(new_code, path)
    if problem is not None:
        for finding in findings:
            finding.applied = False
        result.error = (
            f"internal error: fixes produced invalid code ({problem}); file left unchanged"
        )
        return result
    result.new_code = new_code
    result.new_bytes = new_module.bytes
    # A later finding left unfixed is reported only if the written text still has it.
    final = {(f.code, f.message): f for f in pass_findings}
    for key, finding in later.items():
        if finding.applied:
            result.findings.append(finding)
        elif key in final:
            final[key].rewritten = True
            result.findings.append(final[key])
    result.manifest = contributed
    return result


def _resolver_from(facts: prefilter.CodeFacts) -> NameResolver:
    """The light pass found the same bindings NameResolver would (a test compares them)."""
    resolver = NameResolver()
    resolver.bindings = dict(facts.bindings)
    resolver.imported_modules = set(facts.imported_modules)
    return resolver


def _libcst_error(exc: cst.ParserSyntaxError) -> str:
    message = str(exc).strip().splitlines()[0]
    return f"syntax error at line {exc.raw_line}:{exc.raw_column + 1}: {message}"


def _text_of(source: str | bytes, module: cst.Module) -> str:
    """``module.code`` of the module parsed from ``source`` without generating it (libcst
    round-trips exactly: the text is the source, decoded as libcst decoded it)."""
    if isinstance(source, str):
        return source
    try:
        return source.decode(module.encoding)
    except (LookupError, UnicodeDecodeError):
        return module.code


def _may_suppress(source: str | bytes) -> bool:
    """Whether ``source`` has a suppression comment at all: else findings need no line text,
    whose generation from the tree (``module.code``) costs as much as a parse."""
    if isinstance(source, bytes):
        return _SUPPRESS_BYTES.search(source) is not None
    return _SUPPRESS.search(source) is not None


def _suppressed(lines: list[str], line: int, code: str) -> bool:
    if not 1 <= line <= len(lines):
        return False
    match = _SUPPRESS.search(lines[line - 1])
    if match is None:
        return False
    codes = match.group(1)
    return codes is None or code in {c.strip().upper() for c in codes.split(",")}


def _run_rules(
    module: cst.Module,
    path: str,
    settings: Settings,
    inherited: dict[str, str] | None = None,
    resolver: NameResolver | None = None,
    suppressible: bool = True,
) -> tuple[list[Finding], list[tuple[Finding, Fix | None]], dict[str, str]]:
    if resolver is None:
        resolver = NameResolver.for_module(module, inherited)
    bindings = dict(resolver.bindings)
    if not settings.rules or not resolver.uses_any(prefilter.TF_ROOTS):
        return [], [], bindings
    context = RuleContext(
        PurePosixPath(path), resolver, module, settings.options, fixing=settings.fix
    )
    rules = [rule_class(context) for rule_class in settings.rules]
    try:
        tree.visit_batched(module, rules)
    except Exception as exc:  # a rule bug must not take the whole run down
        raise RuleCrashed(f"a rule crashed on {path}: {type(exc).__name__}: {exc}") from exc
    if not any(rule.reports for rule in rules):
        return [], [], bindings
    lines = module.code.splitlines() if suppressible else []

    findings: list[Finding] = []
    fixes: list[tuple[Finding, Fix]] = []
    seen: set[tuple[int, int, str]] = set()
    for rule in rules:
        for report in rule.reports:
            span = context.position_of(report.node)
            line, col = span.start.line, span.start.column + 1
            if (line, col, rule.code) in seen:
                continue
            seen.add((line, col, rule.code))
            if suppressible and _suppressed(lines, line, rule.code):
                continue
            safety = report.fix.safety if report.fix else rule.fix_safety
            finding = Finding(
                path=path,
                line=line,
                col=col,
                code=rule.code,
                message=report.message,
                safety=safety,
                fixable=report.fix is not None,
                end_line=span.end.line,
            )
            findings.append(finding)
            if report.fix is not None and settings.enabled(report.fix.safety):
                fixes.append((finding, report.fix))
    findings.sort(key=lambda f: (f.line, f.col, f.code))
    return findings, _outermost(fixes, context), bindings


def _outermost(
    fixes: list[tuple[Finding, Fix]], context: RuleContext
) -> list[tuple[Finding, Fix | None]]:
    """Drop fixes nested inside another fix's node; the next pass re-finds them."""
    if len(fixes) < 2:
        return list(fixes)
    fixed = {id(fix.node) for _, fix in fixes}
    kept: list[tuple[Finding, Fix | None]] = []
    first_for_target: dict[int, Fix] = {}
    dropped: set[int] = set()  # nested fixes: not applied in this pass
    for finding, fix in fixes:
        # One fix per target and pass; a finding whose fix equals the one applied is done too.
        first = first_for_target.setdefault(id(fix.node), fix)
        if first is not fix:
            if _same_replacement(first, fix) and id(first) not in dropped:
                kept.append((finding, None))
            continue
        node = context.parent_of(fix.node)
        nested = False
        while node is not None:
            if id(node) in fixed:
                nested = True
                break
            node = context.parent_of(node)
        if not nested:
            kept.append((finding, fix))
        else:
            dropped.add(id(fix))
    return kept


def _same_replacement(a: Fix, b: Fix) -> bool:
    if isinstance(a.replacement, cst.CSTNode) and isinstance(b.replacement, cst.CSTNode):
        return a.replacement.deep_equals(b.replacement)
    return a.replacement is b.replacement


class _ApplyFixes(cst.CSTTransformer):
    def __init__(self, fixes: list[Fix]) -> None:
        super().__init__()
        self._by_node = {id(fix.node): fix for fix in fixes}
        self._keep_alive = fixes

    def on_leave(self, original_node, updated_node):
        fix = self._by_node.get(id(original_node))
        if fix is None:
            return updated_node
        return fix.replacement


def _apply(
    module: cst.Module, fixes: list[tuple[Finding, Fix | None]]
) -> tuple[cst.Module, list[Finding]]:
    applied = [finding for finding, _ in fixes]
    real = [fix for _, fix in fixes if fix is not None]
    new_module = module.visit(_ApplyFixes(real))
    imports = [imp for fix in real for imp in fix.imports]
    if imports:
        # libcst.codemod pulls in libcst.matchers (half a second): only load it when needed.
        from libcst.codemod import CodemodContext
        from libcst.codemod.visitors import AddImportsVisitor

        resolver = NameResolver.for_module(new_module)
        context = CodemodContext()
        for imp in imports:
            local = imp.asname or imp.obj or imp.module.split(".")[0]
            wanted = f"{imp.module}.{imp.obj}" if imp.obj else imp.module
            if resolver.bindings.get(local) == wanted:
                continue
            AddImportsVisitor.add_needed_import(context, imp.module, imp.obj, imp.asname)
        new_module = AddImportsVisitor(context).transform_module(new_module)
    return new_module, applied


def _mark_applied(findings: list[Finding], applied: list[Finding]) -> None:
    for finding in applied:
        for original in findings:
            if original is finding or (
                not original.applied
                and original.code == finding.code
                and original.message == finding.message
            ):
                original.applied = True
                break


def _safety_check(code: str, path: str) -> str | None:
    try:
        cst.parse_module(code)
        compile(code, path, "exec", dont_inherit=True)
    except (cst.ParserSyntaxError, SyntaxError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None
