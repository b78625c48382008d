"""Count lines of code without blank lines, comments and docstrings.

Usage: ``python -m kvtools loc spec/kvspec/*.py`` prints one line per file and a
total. A docstring is any string-literal expression statement (module, class,
function and attribute docstrings).
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def count(path: Path) -> int:
    """Lines of ``path`` that hold code."""
    src = path.read_text()
    doc: set[int] = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            doc.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in _SKIP:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return len(code - doc)


def main(paths: list[str]) -> None:
    """Print per-file counts and the total."""
    total = 0
    for name in sorted(paths):
        n = count(Path(name))
        total += n
        print(f"{n:5d} {name}")
    print(f"{total:5d} total")


if __name__ == "__main__":
    main(sys.argv[1:])
