"""Flow control's decisions (`engine.core.flow`), without a store or a clock: the breaker, the buckets, the queue,
the estimate and the settings."""

from __future__ import annotations

import pytest

from engine.core.errors import Code, RailyardError
from engine.core.flow import (
    Amounts,
    BreakerSettings,
    Limits,
    Waiter,
    affordable,
    breaker_admits,
    breaker_failed,
    breaker_succeeded,
    counts_for_breaker,
    estimate,
    merged,
    new_bucket,
    position,
    queue,
    quota_key,
    quota_take,
    quota_wait,
    recent_serves,
    remaining,
    settlement,
    share_window,
)
from engine.core.model_interface import Message, ModelRequest, Usage


def test_the_breaker_opens_on_the_nth_failure_in_a_row_and_waits_out_its_cool_down() -> None:
    settings = BreakerSettings(failures=2, cool_down_seconds=30)
    row = breaker_failed(None, "k", 100.0, settings)
    assert breaker_admits(row, 100.0) == ("go", 100.0)
    row = breaker_failed(row, "k", 101.0, settings)
    assert row.state == "open"
    assert breaker_admits(row, 120.0) == ("wait", 131.0)
    assert breaker_admits(row, 131.0) == ("probe", 131.0)
    assert breaker_succeeded(row, "k", 132.0).state == "closed"


def test_a_breaker_set_to_zero_failures_never_opens() -> None:
    row = None
    for at in range(50):
        row = breaker_failed(row, "k", float(at), BreakerSettings(failures=0))
    assert row is not None and row.state == "closed"


@pytest.mark.parametrize(
    ("code", "status", "counts"),
    [
        (Code.PROVIDER_ERROR, 503, True),
        (Code.PROVIDER_ERROR, None, True),  # a dropped connection
        (Code.PROVIDER_TIMEOUT, None, True),
        (Code.PROVIDER_ERROR, 400, False),  # the request's fault, not the provider's health
        (Code.RATE_LIMITED, 429, False),  # the quota's business
        (Code.PROVIDER_AUTH, 401, False),
    ],
)
def test_only_failures_that_say_the_provider_is_unwell_count_for_the_breaker(
    code: Code, status: int | None, counts: bool
) -> None:
    assert counts_for_breaker(code, status) is counts


def test_a_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    limits = Limits(requests_per_minute=60, burst_seconds=3)  # 1 a second, 3 deep
    row = new_bucket("k", limits, 0.0)
    for _ in range(3):
        taken = quota_take(row, limits, Amounts(), 0.0, 30)
        assert taken is not None
        row = taken
    assert quota_take(row, limits, Amounts(), 0.0, 30) is None
    assert quota_wait(row, limits, Amounts(), 0.0) == pytest.approx(1.0)
    assert affordable(row, limits, Amounts(), 100.0) == 3  # never more than the burst, however long it rested


def test_a_call_bigger_than_the_burst_waits_for_a_full_bucket_rather_than_forever() -> None:
    limits = Limits(input_tokens_per_minute=600, burst_seconds=1)  # 10 tokens deep
    assert Amounts(1, 5000, 0).within(limits).input_tokens == 10


def test_settling_takes_the_reported_usage_less_the_reservation() -> None:
    reserved = Amounts(1, 100, 1024)
    assert settlement(reserved, Usage(input_tokens=130, output_tokens=24)) == (30, -1000)
    assert settlement(reserved, Usage()) == (0, 0)  # nothing reported: the estimate stands
    assert settlement(reserved, None) == (0, 0)


def test_the_estimate_grows_with_the_prompt_and_reserves_the_answers_cap() -> None:
    short = estimate(ModelRequest("m", (Message("user", "hi"),), max_output_tokens=50))
    long = estimate(ModelRequest("m", (Message("user", "hi " * 1000),)))
    assert short.output_tokens == 50 and long.output_tokens == 1024
    assert long.input_tokens > 700 > short.input_tokens > 0


def test_within_a_priority_groups_take_turns_so_a_batch_cannot_starve_a_small_tenant() -> None:
    big = [Waiter("k", f"big-{i}", 0, "tenant:big", float(i), 0.0) for i in range(100)]
    small = [Waiter("k", f"small-{i}", 0, "tenant:small", 50.0 + i, 0.0) for i in range(3)]
    urgent = Waiter("k", "urgent", 10, "tenant:big", 99.0, 0.0)
    order = [w.task_id for w in queue([*big, *small, urgent])]
    assert order[:7] == ["urgent", "big-0", "small-0", "big-1", "small-1", "big-2", "small-2"]


def test_a_tenant_served_less_lately_goes_first_until_it_has_caught_up() -> None:
    """Fair share over the last minute: a newcomer beside a batch that has been served 600 calls is served first,
    not one call in two; once it has been served as much, the two take turns again."""
    big = [Waiter("k", f"big-{i}", 0, "tenant:big", float(i), 0.0, served=600.0) for i in range(700)]
    small = [Waiter("k", f"small-{i}", 0, "tenant:small", 800.0 + i, 0.0) for i in range(100)]
    order = [w.task_id for w in queue([*big, *small])]
    assert order[:100] == [f"small-{i}" for i in range(100)]
    caught_up = [Waiter("k", f"small-{i}", 0, "tenant:small", 800.0 + i, 0.0, served=600.0) for i in range(3)]
    order = [w.task_id for w in queue([*big[:3], *caught_up])]
    assert order == ["big-0", "small-0", "big-1", "small-1", "big-2", "small-2"]
    # A higher priority still goes before any share.
    urgent = Waiter("k", "urgent", 10, "tenant:big", 999.0, 0.0, served=5000.0)
    assert queue([*small, urgent])[0].task_id == "urgent"


def test_a_groups_recent_serves_are_a_sliding_minute() -> None:
    at = 75.0  # window 1, a quarter of the way in
    assert share_window(at) == 1
    assert recent_serves(1, 10, 30, at) == pytest.approx(10 + 30 * 0.75)  # the window before still counts 3/4
    assert recent_serves(0, 40, 0, at) == pytest.approx(30.0)  # served last window only: 3/4 of it in the minute
    assert recent_serves(-1, 40, 40, at) == 0.0  # nothing for two windows: no share used
    assert recent_serves(1, 10, 30, 60.0) == pytest.approx(40.0)  # the window just begun: all of the one before
    assert recent_serves(2, 5, 10, at) == pytest.approx(5 + 10 * 0.75)  # written by a clock a little ahead


def test_a_waiter_not_coming_back_soon_does_not_hold_a_turn() -> None:
    ahead = Waiter("k", "gone", 5, "g", 0.0, until=10.0)  # was due at 10: its task ended or was served elsewhere
    later = Waiter("k", "later", 5, "g", 1.0, until=500.0)
    me = Waiter("k", "me", 0, "g", 2.0, until=100.0)
    assert position([ahead, later, me], "me", at=100.0, lookahead=5.0, grace=5.0) == 0
    assert position([ahead, later, me], "me", at=12.0, lookahead=5.0, grace=5.0) == 1


def test_the_providers_remaining_quota_headers_are_read_on_both_wires() -> None:
    assert remaining({"x-ratelimit-remaining-requests": "12", "x-ratelimit-remaining-tokens": "3400"}) == {
        "requests": 12,
        "input_tokens": 3400,
    }
    assert remaining(
        {"Anthropic-RateLimit-Output-Tokens-Remaining": "900", "anthropic-ratelimit-requests-remaining": "x"}
    ) == {"output_tokens": 900}


def test_a_quota_per_api_key_is_kept_by_a_fingerprint_never_the_key() -> None:
    per_key = Limits(requests_per_minute=10, per_api_key=True)
    key = quota_key("openai", "gpt-x", per_key, "sk-secret-1")
    assert key.startswith("openai:gpt-x#") and "secret" not in key
    assert key != quota_key("openai", "gpt-x", per_key, "sk-secret-2")
    assert quota_key("openai", "gpt-x", Limits(requests_per_minute=10), "sk-secret-1") == "openai:gpt-x"


def test_the_environment_wins_over_the_profiles_file_entry_by_entry() -> None:
    settings = merged(
        {
            "breaker": {"failures": 3, "cool_down_seconds": 10},
            "quotas": {"openai:gpt-4o*": {"requests_per_minute": 100}, "anthropic:claude-x": {"concurrent_calls": 4}},
            "priorities": {"refund": 10},
        },
        {"breaker": {"cool_down_seconds": 60}, "quotas": {"openai:gpt-4o*": {"input_tokens_per_minute": 5000}}},
    )
    assert settings.breaker == BreakerSettings(failures=3, cool_down_seconds=60)
    assert settings.limits_for("openai", "gpt-4o-mini") == Limits(input_tokens_per_minute=5000)
    assert settings.limits_for("anthropic", "claude-x") == Limits(concurrent_calls=4)
    assert settings.limits_for("openai", "o3") is None
    assert settings.priority_of("refund") == 10 and settings.priority_of("bulk") == 0


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"quotas": {"openai:gpt-4o": {"request_per_minute": 60}}}, "did you mean 'requests_per_minute'?"),
        ({"quotas": {"openai:gpt-4o": {"requests_per_minute": -5}}}, "must be a positive number"),
        ({"quotas": {"openai:gpt-4o": {"concurrent_calls": 2.5}}}, "positive whole number"),
        ({"quotas": {"gpt-4o": {"requests_per_minute": 60}}}, "provider:model"),
        ({"breaker": {"cooldown_seconds": 5}}, "did you mean 'cool_down_seconds'?"),
        ({"priorities": {"refund": "high"}}, "whole number"),
    ],
)
def test_a_bad_flow_setting_is_refused_with_config_invalid_naming_it(doc: dict[str, object], says: str) -> None:
    with pytest.raises(RailyardError) as refused:
        merged(doc, None)
    assert refused.value.code is Code.CONFIG_INVALID
    assert says in refused.value.message
