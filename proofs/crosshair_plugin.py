"""Loader for ``crosshair check --extra_plugin``: CrossHair executes this file
in a namespace of its own, so the creators live in :mod:`kvproofs.plugin`."""

import kvproofs.plugin  # noqa: F401
