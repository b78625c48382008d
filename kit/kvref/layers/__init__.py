"""Layers below the facade that kvref checks on their own (``kvref check --layer``).

:mod:`kvref.layers.pool` is the block pool: its adapter protocol, operations,
reference adapter and lockstep layer; :mod:`kvref.layers.pool_machine` the
state machine that drives it.
"""
