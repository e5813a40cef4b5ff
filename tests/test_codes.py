"""Every code carries its meaning: a category and a reference text; the tables that group codes are read from it."""

from __future__ import annotations

import pytest

from engine import Code, RailyardError, Refused
from engine.cli import AUDIT_CODES, CONFIG_CODES, EXIT_AUDIT, EXIT_REFUSED, EXIT_USAGE
from engine.core.errors import CODE_REFERENCE, REPLAY_FINDINGS, Category
from engine.core.model_errors import PROVIDER_CODES, REQUEST_SHAPE, RETRYABLE


def test_every_code_says_what_kind_it_is_and_what_to_do() -> None:
    for code in Code:
        assert isinstance(code.category, Category), code
        assert code.reference.strip() and code.reference == CODE_REFERENCE[code], code
        assert Code[code.value] is code and str(code) == code.value  # codes are their names on every wire


def test_the_cli_exit_status_follows_the_category() -> None:
    def exit_status(code: Code) -> int:
        return EXIT_AUDIT if code in AUDIT_CODES else EXIT_USAGE if code in CONFIG_CODES else EXIT_REFUSED

    assert exit_status(Code.HASH_MISMATCH) == 3 and exit_status(Code.INTENT_UNSETTLED) == 3
    assert exit_status(Code.MODEL_NOT_CONFIGURED) == 2 and exit_status(Code.CONFIG_INVALID) == 2
    assert exit_status(Code.TASK_TERMINAL) == 1 and exit_status(Code.ACTOR_REQUIRED) == 1
    assert {c for c in Code if c.category is Category.INTEGRITY} == AUDIT_CODES


def test_replay_findings_and_provider_codes_are_read_from_the_categories() -> None:
    assert set(REPLAY_FINDINGS) >= AUDIT_CODES and {Code.DEFINITION_MISSING, Code.DEFINITION_CHANGED} <= set(
        REPLAY_FINDINGS
    )
    assert list(REPLAY_FINDINGS) == [c for c in Code if c in REPLAY_FINDINGS]  # in the enum's order: docs are stable
    assert {c for c in Code if c.category is Category.PROVIDER} == PROVIDER_CODES
    assert RETRYABLE <= PROVIDER_CODES and REQUEST_SHAPE <= PROVIDER_CODES


def test_an_error_cannot_be_raised_without_its_code() -> None:
    with pytest.raises(TypeError):
        Refused("no code")  # type: ignore[call-arg]
    error = RailyardError("x", code=Code.CONFIG_INVALID, setting="RAILYARD_MODEL")
    assert error.to_dict() == {"code": "CONFIG_INVALID", "message": "x", "details": {"setting": "RAILYARD_MODEL"}}
