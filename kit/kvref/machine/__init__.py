"""The rule families of the scheduler machine (:class:`kvref.stateful.SchedulerMachine`).

Each module is one family: a subclass of :class:`kvref.machine.base.MachineBase`
holding that family's actions (methods the machine's one rule, ``step``,
calls by name) and their helpers, and a tuple ``ACTIONS`` saying when each
action is ready. :mod:`kvref.stateful` composes them into the machine and
its step table.

* :mod:`~kvref.machine.configuration`: what a machine runs against
  (:class:`~kvref.machine.configuration.MachineSetup`) and the drawn
  configurations and tokens;
* :mod:`~kvref.machine.base`: the shared state, the setup (``@initialize``)
  and the shared helpers; :class:`~kvref.machine.base.Family`, how a later
  family joins;
* :mod:`~kvref.machine.admission`: new requests and their admission;
* :mod:`~kvref.machine.running`: running steps, finishes, preemptions,
  deferred frees, the start of a scheduler step;
* :mod:`~kvref.machine.speculative`: EAGLE lookahead slots;
* :mod:`~kvref.machine.connectors`: connector tokens and delayed loads;
* :mod:`~kvref.machine.reads`: read-only calls;
* :mod:`~kvref.machine.hit_limits`: the lookup inputs of vLLM 0.33.0 on
  (bounded lookups, ``get_num_cached_tokens``, prompt-logprob requests, late
  skip flags) and requests at the edges (reused ids, wide token ids);
* :mod:`~kvref.machine.invalid` and :mod:`~kvref.machine.invalid_inputs`:
  invalid calls, broken configurations and requests, absent operations;
* directed situations, lined up step by step with
  :mod:`~kvref.machine.scripted`: :mod:`~kvref.machine.flood`,
  :mod:`~kvref.machine.tails` (tail pairs, rekeyed tails),
  :mod:`~kvref.machine.past_slots` (caching past the slots);
* :mod:`~kvref.machine.recording`: the teardown (drain, record a trace).

NOTE: a seeded run draws indices into the step table
(:data:`kvref.stateful.ORDER`), so a new family does not edit it: it is a
module of its own with a :class:`~kvref.machine.base.Family` listed in
:attr:`kvref.stateful.SchedulerMachine.FAMILIES`, whose actions follow the
table only in the runs it takes part in, and a run it takes no part in draws
exactly as before (a family that changes a draw inside an existing action
asks :meth:`~kvref.machine.base.MachineBase.family_on` first). No module here grows past 400 lines
(tests/test_module_size.py); a family that would becomes two.
"""
