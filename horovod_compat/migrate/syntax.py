"""Output that parses on every Python this project supports (3.9+)."""
from __future__ import annotations

import ast
import re
from typing import List, Optional

import libcst as cst


#: Where an f-string can start: its prefix, not preceded by a character of a name.
_FSTRING_START = re.compile(r"(?<!\w)(?:[rR]?[fF]|[fF][rR])['\"]")


def has_fstring(source: str) -> bool:
    """Whether `source` may contain an f-string (a cheap, conservative test: a match inside a
    comment or a string only costs the FStringQuotes walk that would find nothing)."""
    return _FSTRING_START.search(source) is not None


class FStringQuotes(cst.CSTTransformer):
    """Strings the rewrite put inside an f-string's braces must not use the f-string's own quote:
    ``f"{int(os.environ["LOCAL_RANK"])}"`` parses only on Python 3.12+. Such a string takes the
    other quote (``os.environ['LOCAL_RANK']``)."""

    def __init__(self) -> None:
        self.quotes: List[str] = []

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        self.quotes.append(node.start.lstrip("rRfFbBuU"))

    def leave_FormattedString(self, original_node: cst.FormattedString,
                              updated_node: cst.FormattedString) -> cst.FormattedString:
        self.quotes.pop()
        return updated_node

    def leave_SimpleString(self, original_node: cst.SimpleString,
                           updated_node: cst.SimpleString) -> cst.SimpleString:
        if not self.quotes or len(self.quotes[-1]) != 1:
            return updated_node
        value = updated_node.value
        prefix = value[:len(value) - len(value.lstrip("rRbBuU"))]
        body = value[len(prefix):]
        quote = self.quotes[-1]
        other = "'" if quote == '"' else '"'
        if body[:1] != quote or body[:3] == quote * 3 or other in body[1:-1] or "\\" in body:
            return updated_node
        return updated_node.with_changes(value=f"{prefix}{other}{body[1:-1]}{other}")


def parse_problem(before: str, after: str, location: str) -> Optional[str]:
    """Why `after` (the rewrite of `before`) must not be written: it does not compile here, or
    not on Python 3.9's grammar while `before` did. None when it is fine."""
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        compile(after, location, "exec", flags, dont_inherit=True)
    except SyntaxError as err:
        return f"line {err.lineno}: {err.msg}"
    try:
        ast.parse(before, feature_version=(3, 9))
    except SyntaxError:
        return None  # the input needs a newer Python already
    try:
        ast.parse(after, feature_version=(3, 9))
    except SyntaxError as err:
        return f"line {err.lineno}: {err.msg} (on Python 3.9)"
    return None
