"""A C11 lexer for the mutant generator: tokens with exact positions, trivia kept.

:func:`lex` splits a C source into tokens whose texts, joined, give the
source back byte for byte: code tokens (identifiers, keywords, numbers,
string and character literals, punctuators) and trivia (white space,
comments, preprocessor directives). The generator mutates code tokens only,
so nothing inside a comment, a literal or a directive is ever touched.

Handled: ``//`` and ``/* */`` comments (a comment never nests; ``//`` runs
on over a line splice), string and character literals with escapes and the
``u8``/``u``/``U``/``L`` prefixes (a quote or comment marker inside a
literal is text), preprocessor directives (a ``#`` first on its line, after
white space or comments, up to the end of the line, over line splices and
multi-line comments: ``#define`` bodies are trivia), line splices between
tokens, pp-numbers (``0x1fULL``, ``1e-3``, ``0xbf58476d1ce4e5b9ULL``) and
the longest punctuator (``>>=`` before ``>>`` before ``>``). Digraphs and
trigraphs are not (the sources use neither). Anything else raises
:class:`LexError` with its line and column.

NOTE: a hand lexer rather than a parser library. pycparser needs
preprocessed input, and ``Python.h`` does not go through its fake libc
headers; libclang (the clang bindings) would parse everything but is a large
binary dependency tied to an LLVM release, for what the generator needs: the
position of each operator token, matched brackets and statement boundaries,
all of which a lexer gives exactly. C's lexical grammar is small and fixed,
and the tests check the lexer on the edge cases above and that it
reproduces every native source exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


def _words(text: str) -> list[str]:
    """The white-space separated words of ``text``."""
    return text.split()


KEYWORDS = frozenset(
    _words(
        "auto break case char const continue default do double else enum extern float for goto if inline int "
        "long register restrict return short signed sizeof static struct switch typedef union unsigned void "
        "volatile while _Alignas _Alignof _Atomic _Bool _Complex _Generic _Imaginary _Noreturn "
        "_Static_assert _Thread_local"
    )
)
PUNCTUATORS = sorted(
    _words(
        "... <<= >>= -> ++ -- << >> <= >= == != && || *= /= %= += -= &= ^= |= ## [ ] ( ) { } . & * + - ~ ! / "
        "% < > ^ | ? : ; = , #"
    ),
    key=len,
    reverse=True,
)
CODE_KINDS = frozenset(("ident", "keyword", "number", "string", "char", "punct"))
"""Token kinds that are code; the others (``space``, ``comment``, ``preproc``) are trivia."""

_SPACE = re.compile(r"(?:[ \t\f\v\r]|\\\r?\n)+")
_LINE_COMMENT = re.compile(r"//(?:\\\r?\n|[^\n])*")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_NUMBER = re.compile(r"\.?[0-9](?:[eEpP][+-]|[.A-Za-z_0-9])*")
_PREFIX = re.compile(r"(?:u8|u|U|L)?(?=[\"'])")


class LexError(ValueError):
    """The source is not lexically valid C (an unterminated comment or literal, a stray character)."""


@dataclass(frozen=True, slots=True)
class Token:
    """One token: its kind, its text and where it starts (offset, 1-based line and column)."""

    kind: str
    text: str
    offset: int
    line: int
    col: int

    @property
    def end(self) -> int:
        """The offset just past the token."""
        return self.offset + len(self.text)

    @property
    def is_code(self) -> bool:
        """Whether the token is code (not white space, a comment or a directive)."""
        return self.kind in CODE_KINDS


def lex(source: str) -> list[Token]:
    """Every token of ``source``, trivia included, in order.

    Raises:
        LexError: If a comment or a literal is not terminated, or a character
            starts no C token.
    """
    tokens: list[Token] = []
    pos, line, line_start = 0, 1, 0
    first_on_line = True  # only white space and comments so far on this line
    n = len(source)
    while pos < n:
        ch = source[pos]
        if ch == "\n":
            kind, end = "space", pos + 1
        elif (m := _SPACE.match(source, pos)) is not None:
            kind, end = "space", m.end()
        elif source.startswith("/*", pos):
            kind, end = "comment", _block_comment_end(source, pos, line, pos - line_start + 1)
        elif source.startswith("//", pos):
            kind, end = "comment", _match_end(_LINE_COMMENT, source, pos)
        elif ch == "#" and first_on_line:
            kind, end = "preproc", _directive_end(source, pos, line)
        elif (m := _PREFIX.match(source, pos)) is not None:
            quote = source[m.end()]
            kind = "string" if quote == '"' else "char"
            end = _literal_end(source, m.end(), quote, line, pos - line_start + 1)
        elif (m := _IDENT.match(source, pos)) is not None:
            end = m.end()
            kind = "keyword" if source[pos:end] in KEYWORDS else "ident"
        elif (m := _NUMBER.match(source, pos)) is not None:
            kind, end = "number", m.end()
        else:
            punct = next((p for p in PUNCTUATORS if source.startswith(p, pos)), None)
            if punct is None:
                raise LexError(f"line {line}, column {pos - line_start + 1}: no C token starts with {ch!r}")
            kind, end = "punct", pos + len(punct)
        text = source[pos:end]
        tokens.append(Token(kind, text, pos, line, pos - line_start + 1))
        # Only a real newline starts a logical line: one inside a block comment or a line
        # splice does not (a comment is one space, a splice nothing, before directives are seen).
        if text == "\n":
            first_on_line = True
        elif kind not in ("space", "comment"):
            first_on_line = False
        newlines = text.count("\n")
        if newlines:
            line += newlines
            line_start = pos + text.rindex("\n") + 1
        pos = end
    return tokens


def code_tokens(tokens: list[Token]) -> list[Token]:
    """The code tokens of ``tokens`` (trivia dropped)."""
    return [t for t in tokens if t.is_code]


def _match_end(pattern: re.Pattern[str], source: str, pos: int) -> int:
    m = pattern.match(source, pos)
    assert m is not None  # the caller saw the pattern's first characters
    return m.end()


def _block_comment_end(source: str, pos: int, line: int, col: int) -> int:
    close = source.find("*/", pos + 2)
    if close < 0:
        raise LexError(f"line {line}, column {col}: a /* comment is never closed")
    return close + 2


def _literal_end(source: str, pos: int, quote: str, line: int, col: int) -> int:
    """The end of the literal whose opening ``quote`` is at ``pos``."""
    i = pos + 1
    while i < len(source):
        c = source[i]
        if c == "\\":
            i += 2  # an escape, or a line splice (backslash, newline)
            if source[i - 1 : i + 1] == "\r\n":
                i += 1
            continue
        if c == quote:
            return i + 1
        if c == "\n":
            break
        i += 1
    what = "string" if quote == '"' else "character"
    raise LexError(f"line {line}, column {col}: a {what} literal is not closed on its line")


def _directive_end(source: str, pos: int, line: int) -> int:
    """The end of the directive starting at ``pos`` (its final newline not included)."""
    i = pos + 1
    while i < len(source):
        c = source[i]
        if c == "\n":
            return i
        if c == "\\" and source.startswith("\n", i + 1):
            i += 2
        elif c == "\\" and source.startswith("\r\n", i + 1):
            i += 3
        elif source.startswith("/*", i):
            i = _block_comment_end(source, i, line, i + 1)
        elif source.startswith("//", i):
            return _match_end(_LINE_COMMENT, source, i)
        elif c in "\"'" and not _after_include(source, pos, i):
            i = _literal_end(source, i, c, line, i + 1)
        else:
            i += 1
    return i


def _after_include(source: str, start: int, i: int) -> bool:
    """Whether position ``i`` of the directive at ``start`` is inside ``#include <...>`` (a quote there is text)."""
    head = source[start:i]
    return bool(re.match(r"#\s*include\s*<", head)) and ">" not in head.split("<", 1)[1]
