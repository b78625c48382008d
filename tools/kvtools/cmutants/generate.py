"""Operator-level mutants of C sources, each with a stable id.

:func:`mutants` lexes a C file (:mod:`kvtools.cmutants.lexer`), finds the
function bodies (a ``{`` at file scope right after a ``)``) and plants, in
code tokens of those bodies only, one change per mutant:

==========================  ==================================================
operator                    change
==========================  ==================================================
``lt_to_le`` ``le_to_lt``   ``<`` and ``<=`` swapped (one token)
``gt_to_ge`` ``ge_to_gt``   ``>`` and ``>=`` swapped
``eq_to_ne`` ``ne_to_eq``   ``==`` and ``!=`` swapped
``and_to_or`` ``or_to_and`` ``&&`` and ``||`` swapped
``plus1_to_minus1``         binary ``+ 1`` becomes ``- 1``
``minus1_to_plus1``         binary ``- 1`` becomes ``+ 1``
``inc_to_dec`` ``dec_to_inc``  ``++`` and ``--`` swapped (prefix or postfix)
``add_to_sub_assign``       ``+=`` becomes ``-=`` (and ``sub_to_add_assign``)
``zero_to_one``             an integer literal ``0`` (any suffix) becomes ``1``
``one_to_zero``             an integer literal ``1`` becomes ``0``
``return0_to_minus1``       ``return 0;`` becomes ``return -1;``
``return_minus1_to_0``      ``return -1;`` becomes ``return 0;``
``negate_if``               ``if (c)`` becomes ``if (!(c))``
``delete_statement``        an expression statement that assigns or calls
                            becomes ``;``
==========================  ==================================================

Not mutated: comments, string and character literals, preprocessor lines
(``#define`` bodies included), file-scope declarations and tables (data, not
code), the array size of a declaration (``int32_t x[64]``: not a value),
the ``0`` of ``return 0;`` and the ``1`` of ``return -1;`` (the return swaps
cover them: ``return 1`` would read as success to every ``< 0`` check, and
``return -0`` is the swap again), and the deletion of a statement that only
releases a reference or memory (``Py_DECREF``, ``PyMem_Free``, ...): a leak is
not observable through the API (a leak checker's job, not a lockstep's).
Headers are not mutated (``native.h``'s inline helpers are compiled into
every object; a mutant there would be a mutant of every file).

A mutant's id is ``file:line:col:operator`` (1-based line and column of its
first changed token in the unmutated file): it names the same mutant as
long as the file is unchanged up to that line, and the triage file uses it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvtools.cmutants.lexer import Token, code_tokens, lex

SWAPS = {
    "<": ("lt_to_le", "<="),
    "<=": ("le_to_lt", "<"),
    ">": ("gt_to_ge", ">="),
    ">=": ("ge_to_gt", ">"),
    "==": ("eq_to_ne", "!="),
    "!=": ("ne_to_eq", "=="),
    "&&": ("and_to_or", "||"),
    "||": ("or_to_and", "&&"),
    "++": ("inc_to_dec", "--"),
    "--": ("dec_to_inc", "++"),
    "+=": ("add_to_sub_assign", "-="),
    "-=": ("sub_to_add_assign", "+="),
}
"""One-token swaps: token -> (operator, replacement)."""
OPERATORS = (
    *(op for op, _ in SWAPS.values()),
    "plus1_to_minus1",
    "minus1_to_plus1",
    "zero_to_one",
    "one_to_zero",
    "return0_to_minus1",
    "return_minus1_to_0",
    "negate_if",
    "delete_statement",
)
"""Every operator, in the order of the table above."""


def _words(text: str) -> list[str]:
    """The white-space separated words of ``text``."""
    return text.split()


RELEASE_CALLS = frozenset(
    _words(
        "Py_DECREF Py_XDECREF Py_CLEAR PyMem_Free PyMem_RawFree PyObject_Free PyObject_GC_Del "
        "PyBuffer_Release free tp_free keyset_free pool_free_mem"
    )
)
"""Calls a deleted statement may not consist of: they only release (their deletion is a leak)."""
DECL_KEYWORDS = frozenset(
    _words(
        "void char short int long float double signed unsigned _Bool _Complex const volatile static extern "
        "register auto struct union enum typedef inline restrict _Atomic _Alignas _Thread_local "
        "_Static_assert"
    )
)
ASSIGNMENTS = frozenset(_words("= += -= *= /= %= &= |= ^= <<= >>= ++ --"))
OPERAND_END = frozenset(("ident", "number", "string", "char"))
_ZERO_ONE = frozenset(f"{d}{s}" for d in "01" for s in ("", "u", "U", "l", "L", "ul", "UL", "ull", "ULL", "ll", "LL"))


@dataclass(frozen=True, slots=True)
class Mutant:
    """One planted change: ``source[start:end]`` (``original``) becomes ``replacement``."""

    file: str
    line: int
    col: int
    operator: str
    function: str
    start: int
    end: int
    original: str
    replacement: str

    @property
    def id(self) -> str:
        """``file:line:col:operator``, the name the triage file and the reports use."""
        return f"{self.file}:{self.line}:{self.col}:{self.operator}"

    def apply(self, source: str) -> str:
        """``source`` with this mutant planted.

        Raises:
            ValueError: If ``source`` does not hold the original text where the mutant was made.
        """
        if source[self.start : self.end] != self.original:
            raise ValueError(f"{self.id}: the source changed since the mutant was made")
        return source[: self.start] + self.replacement + source[self.end :]

    def describe(self) -> str:
        """A one-line picture of the change: ``original`` -> ``replacement`` (white space collapsed)."""
        return f"{' '.join(self.original.split())} -> {' '.join(self.replacement.split())}"


def mutants(path: Path, name: str | None = None) -> list[Mutant]:
    """Every mutant of the C file ``path`` (named ``name``, default its file name), in source order."""
    return list(mutants_of(path.read_text(), name or path.name))


def mutants_of(source: str, name: str) -> Iterator[Mutant]:
    """Every mutant of ``source`` (a C file called ``name``), in source order (then operator order)."""
    tokens = lex(source)
    found = sorted(_Planter(source, name, tokens).run(), key=lambda m: (m.start, OPERATORS.index(m.operator)))
    seen: set[str] = set()
    for m in found:
        assert m.id not in seen, f"two mutants share the id {m.id}"
        seen.add(m.id)
        yield m


class _Planter:
    """One pass over a file's code tokens: function bodies, statements, operators."""

    def __init__(self, source: str, name: str, tokens: Sequence[Token]) -> None:
        self.source, self.name, self.all = source, name, tokens
        self.code = code_tokens(list(tokens))
        self.match = _brackets(self.code)
        self.out: list[Mutant] = []
        self.function = ""
        self.skip_literal: set[int] = set()  # code-token indexes of literals that are not values
        self.directives = [t for t in tokens if t.kind == "preproc"]

    def run(self) -> list[Mutant]:
        code, i = self.code, 0
        while i < len(code):
            t = code[i]
            if t.text in "({[" and t.kind == "punct":
                if t.text == "{" and i > 0 and code[i - 1].text == ")":
                    self.function = self._function_name(i - 1)
                    self._block(i + 1, self.match[i])
                    self._tokens(i + 1, self.match[i])
                i = self.match[i] + 1
            else:
                i += 1
        return self.out

    def _function_name(self, close: int) -> str:
        open_ = self.match[close]
        return self.code[open_ - 1].text if open_ > 0 and self.code[open_ - 1].kind == "ident" else "?"

    def _add(self, first: Token, last: Token, operator: str, replacement: str) -> None:
        original = self.source[first.offset : last.end]
        self.out.append(
            Mutant(
                self.name, first.line, first.col, operator, self.function, first.offset, last.end, original, replacement
            )
        )

    # --- statements ---------------------------------------------------------------------------

    def _block(self, i: int, end: int) -> None:
        while i < end:
            i = self._statement(i, end)

    def _statement(self, i: int, end: int) -> int:
        """Walk the statement starting at code token ``i``; return the index after it."""
        code = self.code
        t = code[i]
        if t.text == "{":
            self._block(i + 1, self.match[i])
            return self.match[i] + 1
        if t.text == ";":
            return i + 1
        if t.kind == "keyword":
            if t.text in ("if", "while", "switch", "for"):
                close = self.match[i + 1]
                if t.text == "if":
                    self._add(code[i + 1], code[close], "negate_if", self._negated(i + 1, close))
                return self._statement(close + 1, end)
            if t.text == "else":
                return self._statement(i + 1, end)
            if t.text == "do":
                j = self._statement(i + 1, end)  # the body; then "while (c);"
                return self._until(self.match[j + 1] + 1, ";") + 1
            if t.text in ("case", "default"):
                return self._statement(self._until(i, ":") + 1, end)
            if t.text == "return":
                semi = self._until(i, ";")
                self._returns(i, semi)
                return semi + 1
            if t.text in DECL_KEYWORDS:
                return self._declaration(i)
            return self._until(i, ";") + 1  # break, continue, goto
        if t.kind == "ident" and code[i + 1].text == ":":
            return self._statement(i + 2, end)  # a label
        if self._is_declaration(i):
            return self._declaration(i)
        semi = self._until(i, ";")
        if self._deletable(i, semi):
            self._add(code[i], code[semi], "delete_statement", ";")
        return semi + 1

    def _until(self, i: int, text: str) -> int:
        """The index of the first ``text`` token at bracket depth 0 from ``i``."""
        code = self.code
        while code[i].text != text or code[i].kind != "punct":
            i = self.match[i] + 1 if code[i].text in "({[" and code[i].kind == "punct" else i + 1
        return i

    def _is_declaration(self, i: int) -> bool:
        """``T x``, ``T *x``, ``T **x`` (two names in a row never start an expression)."""
        code = self.code
        if code[i].kind != "ident":
            return False
        j = i + 1
        while code[j].text == "*":
            j += 1
        return code[j].kind == "ident"

    def _declaration(self, i: int) -> int:
        """Skip a declaration; the array sizes it declares are not values."""
        code = self.code
        semi = self._until(i, ";")
        j = i
        while j < semi:
            if code[j].text == "[" and (code[j - 1].kind == "ident" or code[j - 1].text == "]"):
                self.skip_literal.update(range(j, self.match[j]))
            if code[j].text == "=":
                j = self._until_either(j, (",", ";"))  # the initializer: values from here
                continue
            j = self.match[j] + 1 if code[j].text in "({" and code[j].kind == "punct" else j + 1
        return semi + 1

    def _until_either(self, i: int, texts: tuple[str, ...]) -> int:
        code = self.code
        while not (code[i].kind == "punct" and code[i].text in texts):
            i = self.match[i] + 1 if code[i].text in "({[" and code[i].kind == "punct" else i + 1
        return i

    def _deletable(self, first: int, semi: int) -> bool:
        """An expression statement that assigns or calls, and is not only a release."""
        code = self.code
        if any(code[first].offset < t.offset < code[semi].offset for t in self.directives):
            return False
        assigns = calls = False
        last_call = ""
        j = first
        while j < semi:
            t = code[j]
            if t.kind == "punct" and t.text in ASSIGNMENTS:
                assigns = True
            if t.text == "(" and t.kind == "punct":
                if j > first and (code[j - 1].kind == "ident" or code[j - 1].text == ")"):
                    calls = True
                    last_call = code[j - 1].text
                j = self.match[j] + 1
                continue
            j += 1
        if not (assigns or calls):
            return False
        return assigns or last_call not in RELEASE_CALLS

    def _returns(self, ret: int, semi: int) -> None:
        code = self.code
        value = code[ret + 1 : semi]
        if [t.text for t in value] == ["0"]:
            self._add(value[0], value[0], "return0_to_minus1", "-1")
            self.skip_literal.add(ret + 1)
        elif [t.text for t in value] == ["-", "1"]:
            self._add(value[0], value[1], "return_minus1_to_0", "0")
            self.skip_literal.add(ret + 2)

    def _negated(self, open_: int, close: int) -> str:
        inner = self.source[self.code[open_].end : self.code[close].offset]
        return f"(!({inner}))"

    # --- token operators ----------------------------------------------------------------------

    def _tokens(self, lo: int, hi: int) -> None:
        code = self.code
        for i in range(lo, hi):
            t = code[i]
            if t.kind == "punct" and t.text in SWAPS:
                operator, replacement = SWAPS[t.text]
                self._add(t, t, operator, replacement)
            elif t.kind == "punct" and t.text in "+-" and self._binary(i) and code[i + 1].text == "1":
                self._add(
                    t, t, "plus1_to_minus1" if t.text == "+" else "minus1_to_plus1", "-" if t.text == "+" else "+"
                )
            elif t.kind == "number" and t.text in _ZERO_ONE and i not in self.skip_literal:
                if t.text[0] == "0":
                    self._add(t, t, "zero_to_one", "1" + t.text[1:])
                else:
                    self._add(t, t, "one_to_zero", "0" + t.text[1:])

    def _binary(self, i: int) -> bool:
        """Whether the ``+``/``-`` at ``i`` is binary (it follows an operand)."""
        prev = self.code[i - 1]
        return prev.kind in OPERAND_END or prev.text in (")", "]", "++", "--")


def _brackets(code: Sequence[Token]) -> dict[int, int]:
    """Index of the matching bracket for every ``( [ {`` and ``) ] }`` code token.

    Raises:
        ValueError: If the brackets do not balance.
    """
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[int] = []
    match: dict[int, int] = {}
    for i, t in enumerate(code):
        if t.kind != "punct":
            continue
        if t.text in "([{":
            stack.append(i)
        elif t.text in pairs:
            if not stack or code[stack[-1]].text != pairs[t.text]:
                raise ValueError(f"line {t.line}, column {t.col}: unbalanced {t.text!r}")
            j = stack.pop()
            match[i], match[j] = j, i
    if stack:
        t = code[stack[-1]]
        raise ValueError(f"line {t.line}, column {t.col}: {t.text!r} is never closed")
    return match
