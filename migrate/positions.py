"""libcst's ``PositionProvider`` positions, computed lazily: the same ranges for the nodes asked.

``PositionProvider`` generates the module's code and, for every node, builds two
``CodePosition`` objects and a ``CodeRange``, after splitting every token on newlines to keep a
line and column. A file with findings asks for a few dozen of its hundreds of thousands of
nodes. Here code generation records only token indices (two integers per node); a node's
line and column are worked out when it is asked for, from the tokens' lengths and the offsets
of the newlines in the generated text.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition, CodeRange

# As ``PositionProvider``: "\r\n", "\r" and "\n" each end a line.
_NEWLINE = re.compile(r"\r\n?|\n")


class _IndexRecordingState(CodegenState):
    """Code generation that records, per node, the token indices where it starts and ends,
    with the same syntactic overrides ``PositionProvider``'s state applies."""

    def __init__(self, module: cst.Module) -> None:
        super().__init__(
            default_indent=module.default_indent, default_newline=module.default_newline
        )
        self.spans: dict[cst.CSTNode, tuple[int, int]] = {}
        self._starts: list[int] = []

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._starts.append(len(self.tokens))

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._starts.pop()
        if node not in self.spans:  # a syntactic position recorded inside wins
            self.spans[node] = (start, len(self.tokens))

    def pop_trailing_newline(self) -> None:
        # PositionProvider counts the dropped newline in the module's end: keep the token.
        pass

    @contextmanager
    def record_syntactic_position(
        self,
        node: cst.CSTNode,
        *,
        start_node: cst.CSTNode | None = None,
        end_node: cst.CSTNode | None = None,
    ) -> Iterator[None]:
        start = len(self.tokens)
        try:
            yield
        finally:
            end = len(self.tokens)
            if start_node is not None:
                start = self.spans[start_node][0]
            if end_node is not None:
                end = self.spans[end_node][1]
            self.spans[node] = (start, end)


class LazyPositions(Mapping[cst.CSTNode, CodeRange]):
    """node -> ``CodeRange``, as ``PositionProvider`` computes it, for every node of a module."""

    def __init__(self, module: cst.Module) -> None:
        state = _IndexRecordingState(module)
        module._codegen(state)
        self._spans = state.spans
        self._tokens = state.tokens
        self._offsets: list[int] | None = None  # character offset where each token starts
        self._line_ends: list[int] = []  # offsets just after each newline
        self._exact: list[tuple[int, int]] | None = None  # per-token positions, if needed

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        start, end = self._spans[node]
        return CodeRange(self._position(start), self._position(end))

    def __iter__(self) -> Iterator[cst.CSTNode]:
        return iter(self._spans)

    def __len__(self) -> int:
        return len(self._spans)

    def _position(self, index: int) -> CodePosition:
        """Line (1-based) and column (0-based) after the first ``index`` tokens."""
        if self._offsets is None:
            self._index()
        if self._exact is not None:
            return CodePosition(*self._exact[index])
        assert self._offsets is not None  # _index() sets it
        offset = self._offsets[index]
        line = bisect.bisect_right(self._line_ends, offset)
        column = offset - (self._line_ends[line - 1] if line else 0)
        return CodePosition(line + 1, column)

    def _index(self) -> None:
        self._offsets = [0, *itertools.accumulate(map(len, self._tokens))]
        text = "".join(self._tokens)
        if "\r" in text:
            # A "\r" and a "\n" in two tokens are two line ends for PositionProvider, one in
            # the joined text: count token by token, as it does.
            self._exact = self._per_token()
            return
        self._line_ends = [match.end() for match in _NEWLINE.finditer(text)]

    def _per_token(self) -> list[tuple[int, int]]:
        line, column = 1, 0
        found = [(line, column)]
        for token in self._tokens:
            segments = _NEWLINE.split(token)
            if len(segments) == 1:
                column += len(token)
            else:
                line += len(segments) - 1
                column = len(segments[-1])
            found.append((line, column))
        return found
