"""Count lines of code without blank lines, comments and docstrings.

Usage: ``python -m kvtools loc [PATH ...]`` prints one line per Python file and
a total; a folder counts every ``*.py`` below it, and no argument means
``spec/kvspec`` (the specification's size). A docstring is any string-literal expression statement (module, class,
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


def main(paths: list[str]) -> int:
    """Print per-file counts and the total; 2 for a path that does not exist."""
    files: list[Path] = []
    for name in paths or ["spec/kvspec"]:
        path = Path(name)
        if not path.exists():
            print(f"kvtools loc: {name}: no such file or folder", file=sys.stderr)
            return 2
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    total = 0
    for path in files:
        n = count(path)
        total += n
        print(f"{n:5d} {path}")
    print(f"{total:5d} total")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
