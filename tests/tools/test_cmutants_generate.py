"""The C mutant generator (kvtools.cmutants): its lexer's edge cases, every operator, stable ids."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kvtools.cmutants.build import SOURCES
from kvtools.cmutants.generate import OPERATORS, Mutant, mutants, mutants_of
from kvtools.cmutants.lexer import LexError, code_tokens, lex

NATIVE = sorted(SOURCES.glob("*.[ch]"))


def texts(source: str) -> list[str]:
    return [t.text for t in code_tokens(lex(source))]


def planted(source: str) -> list[Mutant]:
    return list(mutants_of(textwrap.dedent(source), "x.c"))


def changes(source: str, operator: str | None = None) -> list[str]:
    """``operator change`` of every mutant (of ``operator`` only, if given)."""
    return [f"{m.operator} {m.describe()}" for m in planted(source) if operator is None or m.operator == operator]


# --- the lexer --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", NATIVE, ids=lambda p: p.name)
def test_lexer_gives_every_native_source_back(path: Path) -> None:
    """Joined, the tokens are the file, byte for byte; positions are right."""
    source = path.read_text()
    tokens = lex(source)
    assert "".join(t.text for t in tokens) == source
    lines = source.splitlines(keepends=True)
    for t in tokens:
        assert source[t.offset : t.end] == t.text
        assert lines[t.line - 1][t.col - 1 :].startswith(t.text.split("\n", 1)[0])


def test_comments_are_trivia() -> None:
    src = "a /* b < c && d */ < e; // f == g \\\n still the comment\nh;"
    assert texts(src) == ["a", "<", "e", ";", "h", ";"]
    assert [t.kind for t in lex(src) if t.kind == "comment"] == ["comment", "comment"]


def test_literals_hide_their_contents() -> None:
    src = r"""s = "a < b /* not a comment */ \" == "; c = '"'; d = '\''; e = u8"x" L'y';"""
    assert texts(src) == ["s", "=", r'"a < b /* not a comment */ \" == "', ";", "c", "=", "'\"'", ";", "d", "=",
                          r"'\''", ";", "e", "=", 'u8"x"', "L'y'", ";"]  # fmt: skip
    kinds = [t.kind for t in code_tokens(lex(src))]
    assert kinds.count("string") == 2 and kinds.count("char") == 3


def test_preprocessor_lines_are_trivia() -> None:
    src = (
        "#include <a'b.h>\n  #define LT(a, b) ((a) < \\\n (b) + 1)\n/* c */ # if X == 1 /* multi\nline */\n"
        "x = LT(1, 2);\ny = a # b;\n"
    )
    tokens = lex(src)
    assert [t.text.split()[0] for t in tokens if t.kind == "preproc"] == ["#include", "#define", "#"]
    # the directive ends at the end of its line, past a splice and a multi-line comment
    assert texts(src) == ["x", "=", "LT", "(", "1", ",", "2", ")", ";", "y", "=", "a", "#", "b", ";"]


def test_numbers_and_longest_punctuators() -> None:
    assert texts("x>>=1;y=0xbf58476d1ce4e5b9ULL+1e-3-.5;p->q++;a<<=b>=c") == [
        "x", ">>=", "1", ";", "y", "=", "0xbf58476d1ce4e5b9ULL", "+", "1e-3", "-", ".5", ";", "p", "->", "q", "++",
        ";", "a", "<<=", "b", ">=", "c",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ("a /* never closed", "never closed"),
        ('s = "open\n";', "not closed"),
        ("c = 'x;\n", "not closed"),
        ("a @ b", "no C token"),
    ],
)
def test_lexical_errors_name_the_place(source: str, what: str) -> None:
    with pytest.raises(LexError, match=what):
        lex(source)


# --- operators --------------------------------------------------------------------------------

BODY = """\
static int table[2] = {0, 1};   /* file scope: data, never mutated */
#define BIG(x) ((x) > 1)

int f(int *a, int n) {
    int buf[1];
    int i = 0;
    if (n < 0 || a == NULL)
        return -1;
    for (i = 0; i <= n - 1; i++) {
        a[i] += 1;
        call(a, "x < y");
    }
    while (n >= 1 && n != 2)
        n--;
    Py_DECREF(a);
    return 0;
}
"""


def test_every_operator_on_a_small_function() -> None:
    got = changes(BODY)
    assert got == [
        "zero_to_one 0 -> 1",  # int i = 0 (a value); buf[1] is a size, not a value
        "negate_if (n < 0 || a == NULL) -> (!(n < 0 || a == NULL))",
        "lt_to_le < -> <=",
        "zero_to_one 0 -> 1",
        "or_to_and || -> &&",
        "eq_to_ne == -> !=",
        "return_minus1_to_0 -1 -> 0",
        "zero_to_one 0 -> 1",  # for (i = 0
        "le_to_lt <= -> <",
        "minus1_to_plus1 - -> +",
        "one_to_zero 1 -> 0",
        "inc_to_dec ++ -> --",
        "delete_statement a[i] += 1; -> ;",
        "add_to_sub_assign += -> -=",
        "one_to_zero 1 -> 0",
        'delete_statement call(a, "x < y"); -> ;',  # nothing inside the string
        "ge_to_gt >= -> >",
        "one_to_zero 1 -> 0",
        "and_to_or && -> ||",
        "ne_to_eq != -> ==",
        "delete_statement n--; -> ;",
        "dec_to_inc -- -> ++",
        "return0_to_minus1 0 -> -1",  # Py_DECREF(a) is a release: not deleted
    ]
    assert {m.function for m in planted(BODY)} == {"f"}


def test_remaining_operators_and_statement_forms() -> None:
    src = """\
    static long g(long x, long *p) {
        x = x + 1;
        x -= 2;
        *p = x;
        Core *c = make(x);
        label:
        switch (x) {
        case 0:
            x = 1;
            break;
        default:
            do { x--; } while (x > 0);
        }
        if (x) y(); else z();
        return x ? 1 : 0;
    }
    """
    got = changes(src)
    assert "plus1_to_minus1 + -> -" in got
    assert "sub_to_add_assign -= -> +=" in got
    assert "delete_statement *p = x; -> ;" in got
    assert not any("make(x)" in c for c in got if c.startswith("delete_statement"))  # a declaration
    assert "delete_statement x = 1; -> ;" in got  # after a case label
    assert "delete_statement x--; -> ;" in got  # inside do ... while
    assert "delete_statement y(); -> ;" in got and "delete_statement z(); -> ;" in got
    assert "zero_to_one 0 -> 1" in got  # case 0 and the ternary's 0 are values
    assert {c.split()[0] for c in got} >= {"plus1_to_minus1", "sub_to_add_assign", "gt_to_ge", "negate_if"}
    applied = [m.apply(textwrap.dedent(src)) for m in planted(src)]
    assert len(set(applied)) == len(applied)  # every mutant changes the source, each differently


def test_unary_minus_and_plus_are_not_off_by_one() -> None:
    got = changes("int h(int x) { x = -1; return f(+1, x - 1); }\n", None)
    assert [c for c in got if "1_to_" in c] == ["minus1_to_plus1 - -> +"]


def test_apply_refuses_a_changed_source() -> None:
    m = planted(BODY)[0]
    with pytest.raises(ValueError, match="changed"):
        m.apply(textwrap.dedent(BODY).replace("int i = 0", "int i = 7"))


def test_ids_are_stable_and_unique() -> None:
    """Ids do not depend on the pass, and mutants above an edit keep theirs."""
    first = [m.id for m in planted(BODY)]
    assert first == [m.id for m in planted(BODY)]
    assert len(set(first)) == len(first)
    assert all(m.id == f"x.c:{m.line}:{m.col}:{m.operator}" for m in planted(BODY))
    edited = textwrap.dedent(BODY).replace("    return 0;\n}", "    n = n * 3;\n    return 0;\n}")
    after = [m.id for m in mutants_of(edited, "x.c")]
    kept = [i for i in first if int(i.split(":")[1]) < 16]
    assert kept == after[: len(kept)]


def test_every_native_source_has_mutants_of_most_operators() -> None:
    """The real sources lex, balance and yield unique ids; every operator shows up somewhere."""
    ids: set[str] = set()
    ops: set[str] = set()
    for path in sorted(SOURCES.glob("*.c")):
        found = mutants(path)
        assert found, path.name
        ids.update(m.id for m in found)
        ops.update(m.operator for m in found)
        assert len({m.id for m in found}) == len(found)
        source = path.read_text()
        for m in found:
            assert source[m.start : m.end] == m.original
            assert not source[: m.start].rstrip().endswith("#define")
    assert ops == set(OPERATORS)
