"""The vLLM adapter quiets the engine's logs unless the user chose a level."""

from __future__ import annotations

import logging
import os

import pytest

from kvref.adapters.vllm.eras import quiet_logs


def test_an_unset_level_variable_quiets_the_package_logger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVREF_TEST_LOGGING_LEVEL", raising=False)
    logger = logging.getLogger("kvref_test_engine_a")
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    after_import = quiet_logs("KVREF_TEST_LOGGING_LEVEL")
    assert os.environ["KVREF_TEST_LOGGING_LEVEL"] == "ERROR"
    after_import("kvref_test_engine_a")
    assert logger.level == logging.ERROR


def test_a_level_the_user_set_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVREF_TEST_LOGGING_LEVEL", "DEBUG")
    logger = logging.getLogger("kvref_test_engine_b")
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    quiet_logs("KVREF_TEST_LOGGING_LEVEL")("kvref_test_engine_b")
    assert logger.level == logging.NOTSET
    assert os.environ["KVREF_TEST_LOGGING_LEVEL"] == "DEBUG"
