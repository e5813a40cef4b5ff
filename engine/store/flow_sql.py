"""The SQL of the flow-control rows (`engine.store.protocol.FlowStore`), written once for both databases.

The statements differ between SQLite and PostgreSQL only in three words: the database's clock in epoch seconds
and the two-argument `MIN`/`MAX` (`LEAST`/`GREATEST` on PostgreSQL). Each dialect module builds its own set with
`statements` (`engine.store.sqlite.FLOW`, `engine.store.postgres.FLOW`), so call sites look statements up by
name and never ask which database they are on. Parameters are named (SQLAlchemy `text`).

The clock is the database's, never a worker's: two workers whose clocks differ by a second would otherwise
refill one bucket twice or hold a breaker open for different times. Each statement reads it once (SQLite's
`julianday('now')` is fixed for a statement; PostgreSQL's `statement_timestamp()` likewise).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The columns of a bucket as `engine.core.flow.QuotaRow` takes them, the clock read with them last.
QUOTA_COLUMNS = "key, requests, input_tokens, output_tokens, in_flight, in_flight_until, refilled_at, paused_until"
BREAKER_COLUMNS = "key, state, failures, open_until, probe_until, changed_at"
WAIT_COLUMNS = "key, task_id, priority, grp, since, until"
#: A waiter as `engine.store.sql_flow.waiter` reads it: its row, then its group's serves (`flow_shares`, NULL if
#: the group was never served from this line).
WAIT_SELECT = (
    "SELECT w.key, w.task_id, w.priority, w.grp, w.since, w.until, s.win, s.served, s.served_before"
    " FROM flow_waits w LEFT JOIN flow_shares s ON s.key = w.key AND s.grp = w.grp"
)


@dataclass(frozen=True)
class Statements:
    NOW: str
    BREAKER: str
    BREAKER_FAILED: str
    BREAKER_PROBE: str
    BREAKER_CLOSED: str
    QUOTA_ENSURE: str
    QUOTA_TAKE: str
    QUOTA_READ: str
    QUOTA_SETTLE: str
    QUOTA_PAUSE: str
    QUOTA_ADAPT: str
    WAIT_JOIN: str
    WAIT_PURGE: str
    WAIT_LIST: str
    WAIT_PLACE: str
    WAIT_UNTIL: str
    WAIT_LEAVE: str
    SHARE_CHARGE: str
    TASK_PRIORITY: str
    ALL_BREAKERS: str
    ALL_QUOTAS: str
    ALL_WAITS: str
    WAITS_OF: str


def statements(now: str, least: str, greatest: str) -> Statements:
    """The statements with this database's clock (`now`, epoch seconds) and two-argument min and max."""

    def level(column: str, measure: str) -> str:
        # The level now: what it was at `refilled_at`, refilled at the rate since (never backwards), capped.
        return f"{least}(:cap_{measure}, {column} + {greatest}({now} - refilled_at, 0) * :rate_{measure})"

    flying = f"(CASE WHEN in_flight_until < {now} THEN 0 ELSE in_flight END)"
    opens = (
        "(flow_breakers.state = 'half_open' OR (flow_breakers.state = 'closed'"
        " AND :threshold > 0 AND flow_breakers.failures + 1 >= :threshold))"
    )
    return Statements(
        NOW=f"SELECT {now}",
        BREAKER=f"SELECT {BREAKER_COLUMNS}, {now} FROM flow_breakers WHERE key = :key",
        BREAKER_FAILED=(
            f"INSERT INTO flow_breakers ({BREAKER_COLUMNS}) VALUES (:key,"
            " CASE WHEN :threshold = 1 THEN 'open' ELSE 'closed' END, 1,"
            f" CASE WHEN :threshold = 1 THEN {now} + :cool ELSE 0 END, 0, {now})"
            " ON CONFLICT (key) DO UPDATE SET failures = flow_breakers.failures + 1,"
            f" state = CASE WHEN {opens} THEN 'open' ELSE flow_breakers.state END,"
            f" open_until = CASE WHEN {opens} THEN {now} + :cool ELSE flow_breakers.open_until END,"
            f" changed_at = CASE WHEN {opens} THEN {now} ELSE flow_breakers.changed_at END"
            f" RETURNING {BREAKER_COLUMNS}, {now}"
        ),
        BREAKER_PROBE=(
            f"UPDATE flow_breakers SET state = 'half_open', probe_until = {now} + :probe, changed_at = {now}"
            f" WHERE key = :key AND ((state = 'open' AND open_until <= {now})"
            f" OR (state = 'half_open' AND probe_until <= {now}))"
        ),
        BREAKER_CLOSED=(
            "UPDATE flow_breakers SET failures = 0, state = 'closed',"
            f" changed_at = CASE WHEN state <> 'closed' THEN {now} ELSE changed_at END"
            " WHERE key = :key AND (state <> 'closed' OR failures > 0)"
        ),
        QUOTA_ENSURE=(
            f"INSERT INTO flow_quotas ({QUOTA_COLUMNS}, limits)"
            f" VALUES (:key, :requests, :input_tokens, :output_tokens, 0, 0, {now}, 0, :limits)"
            " ON CONFLICT (key) DO UPDATE SET limits = :limits"
        ),
        QUOTA_TAKE=(
            f"UPDATE flow_quotas SET requests = {level('requests', 'r')} - :take_r,"
            f" input_tokens = {level('input_tokens', 'i')} - :take_i,"
            f" output_tokens = {level('output_tokens', 'o')} - :take_o,"
            f" in_flight = {flying} + 1, in_flight_until = {greatest}(in_flight_until, {now} + :hold),"
            f" refilled_at = {greatest}(refilled_at, {now})"
            f" WHERE key = :key AND paused_until <= {now}"
            f" AND {level('requests', 'r')} >= :take_r AND {level('input_tokens', 'i')} >= :take_i"
            f" AND {level('output_tokens', 'o')} >= :take_o AND {flying} < :concurrent"
            f" RETURNING {QUOTA_COLUMNS}, {now}"
        ),
        QUOTA_READ=f"SELECT {QUOTA_COLUMNS}, {now} FROM flow_quotas WHERE key = :key",
        QUOTA_SETTLE=(
            "UPDATE flow_quotas SET input_tokens = input_tokens - :input_tokens,"
            " output_tokens = output_tokens - :output_tokens,"
            " in_flight = CASE WHEN :release = 1 AND in_flight > 0 THEN in_flight - 1 ELSE in_flight END"
            " WHERE key = :key"
        ),
        QUOTA_PAUSE=(
            f"UPDATE flow_quotas SET paused_until = {greatest}(paused_until, {now} + :seconds) WHERE key = :key"
        ),
        QUOTA_ADAPT=(
            f"UPDATE flow_quotas SET requests = {least}({level('requests', 'r')}, :left_r),"
            f" input_tokens = {least}({level('input_tokens', 'i')}, :left_i),"
            f" output_tokens = {least}({level('output_tokens', 'o')}, :left_o),"
            f" refilled_at = {greatest}(refilled_at, {now}) WHERE key = :key"
        ),
        WAIT_JOIN=(
            f"INSERT INTO flow_waits ({WAIT_COLUMNS}) VALUES (:key, :task_id, :priority, :grp, {now}, {now} + :wait)"
            f" ON CONFLICT (key, task_id) DO UPDATE SET until = {now} + :wait, priority = :priority"
        ),
        WAIT_PURGE=f"DELETE FROM flow_waits WHERE key = :key AND until < {now} - :stale",
        WAIT_LIST=f"{WAIT_SELECT} WHERE w.key = :key",
        # A waiter's place (`engine.core.flow.place_in`, the same order as `queue`), counted in the database so a
        # look reads one row, not the line: a waiter's turn is its group's recent serves (`recent_serves`, with
        # the clock's window :win and the weight :still of the one before) plus its group's waiters ahead of it.
        WAIT_PLACE=(
            "WITH line AS (SELECT w.task_id, w.priority, w.since, w.until,"
            " (CASE WHEN s.win IS NULL THEN 0.0 WHEN s.win >= :win THEN s.served + s.served_before * :still"
            " WHEN s.win = :win - 1 THEN s.served * :still ELSE 0.0 END)"
            " + (ROW_NUMBER() OVER (PARTITION BY w.priority, w.grp ORDER BY w.since, w.task_id) - 1) AS turn"
            " FROM flow_waits w LEFT JOIN flow_shares s ON s.key = w.key AND s.grp = w.grp WHERE w.key = :key),"
            " me AS (SELECT priority, turn, since, task_id FROM line WHERE task_id = :task_id)"
            " SELECT COALESCE(SUM(CASE WHEN line.until >= :at - :grace AND line.until <= :at + :lookahead"
            " THEN 1 ELSE 0 END), 0),"
            " COALESCE(SUM(CASE WHEN line.until >= :at - :grace THEN 1 ELSE 0 END), 0),"
            " (SELECT COUNT(*) FROM line), (SELECT since FROM me)"
            " FROM line, me WHERE line.priority > me.priority OR (line.priority = me.priority AND"
            " (line.turn < me.turn OR (line.turn = me.turn AND (line.since < me.since"
            " OR (line.since = me.since AND line.task_id < me.task_id)))))"
        ),
        WAIT_UNTIL=f"UPDATE flow_waits SET until = {now} + :wait WHERE key = :key AND task_id = :task_id",
        WAIT_LEAVE="DELETE FROM flow_waits WHERE key = :key AND task_id = :task_id RETURNING grp",
        # One more call served to the group in window :win (`engine.core.flow.share_window` of the clock): the
        # window moved on by one, this window's count becomes the one before; by more, both start again. A
        # writer whose clock read is older than the row's window counts in the row's window (never backwards).
        SHARE_CHARGE=(
            "INSERT INTO flow_shares (key, grp, win, served, served_before) VALUES (:key, :grp, :win, 1, 0)"
            " ON CONFLICT (key, grp) DO UPDATE SET"
            " served_before = CASE WHEN flow_shares.win >= :win THEN flow_shares.served_before"
            " WHEN flow_shares.win = :win - 1 THEN flow_shares.served ELSE 0 END,"
            " served = CASE WHEN flow_shares.win >= :win THEN flow_shares.served + 1 ELSE 1 END,"
            " win = CASE WHEN flow_shares.win >= :win THEN flow_shares.win ELSE :win END"
        ),
        TASK_PRIORITY="SELECT priority, tenant, workflow FROM tasks WHERE task_id = :task_id",
        ALL_BREAKERS=f"SELECT {BREAKER_COLUMNS}, {now} FROM flow_breakers ORDER BY key",
        ALL_QUOTAS=f"SELECT {QUOTA_COLUMNS}, {now}, limits FROM flow_quotas ORDER BY key",
        ALL_WAITS=f"{WAIT_SELECT} ORDER BY w.key, w.since",
        WAITS_OF=(
            f"{WAIT_SELECT}"
            " WHERE w.key IN (SELECT key FROM flow_waits WHERE task_id = :task_id) ORDER BY w.key, w.since"
        ),
    )
