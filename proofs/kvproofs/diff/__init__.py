"""Wrappers for ``crosshair diffbehavior`` between kvspec and kvimpl
(``proofs/diffbehavior.md``): plain-int signatures that build the real
arguments on each side."""
