"""kvref: the conformance kit for paged KV-cache managers.

Adapters (:mod:`kvref.adapters`) put an implementation behind vLLM 0.25.1's
facade; the lockstep state machines (:mod:`kvref.stateful`) drive several of
them through scheduler-like histories and compare every output and view;
traces (:mod:`kvref.traces`) replay such histories in any language; the CLI
(``kvref check``) runs it all.
"""
