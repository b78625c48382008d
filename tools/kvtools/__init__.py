"""kvtools: project tooling of kvref, never shipped in the wheel.

One entry point, ``python -m kvtools <task>`` (see :mod:`kvtools.__main__`):
the bug zoo, generic mutants, the recorders of the directed and divergence
trace corpora, the hash vectors, the CUDA check of kvimpl's device tables and
the line counter. Tooling may import the kit (``kvref``), the spec and the
implementation; nothing imports tooling.
"""
