"""The audit chain end to end, on both adapters: a store written as the runner writes it, then
tampered with through a raw connection, as someone with access to the file or the database would;
verify must name the first broken link, export must let a reader re-hash every record it contains.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from poirotd.cli.main import app
from poirotd.devtools.postgres import PostgresServer
from poirotd.model import (
    AgentReputation,
    Attribution,
    ConfirmedOutcome,
    EventKind,
    HazardEvent,
    Investigation,
    InvestigationState,
    LLMExchange,
    Phase,
    PhaseTiming,
    SessionEnd,
    Vote,
)
from poirotd.observability.metrics import Metrics
from poirotd.store import SqliteStore, Store, canonical_json, entry_hash
from poirotd.store.audit import AuditError, ChainHead, export_investigation, verify
from poirotd.store.checkpoints import ChainCheckpoints
from poirotd.store.schema import SCHEMA_VERSION
from tests.support.store import T0, event, investigation, message, sample, session, space
from tests.support.stores import PostgresDb, SqliteDb, StoreDb

UMLAUT = "Kniewinkel über 60° ✓"


def exchange(purpose: str) -> LLMExchange:
    return LLMExchange(
        phase=Phase.SELF_ASSESSMENT,
        agent_id="planner",
        purpose=purpose,
        messages=(
            {"role": "system", "content": "You are the planner."},
            {"role": "user", "content": "what happened?"},
        ),
        response='{"role_fulfilled": true}',
        prompt_tokens=812,
        completion_tokens=40,
        cached_tokens=800,
        seconds=1.25,
        at=T0,
    )


async def write_as_the_runner(store: Store) -> None:
    """Sessions, messages, telemetry, hazard spaces and an investigation, in the order the
    runner writes them."""
    await store.commit_ingest([session(), *map(message, range(4)), sample(0, 1.0)])
    await store.commit_ingest([message(1), sample(1, 2.5)])  # message 1 resent
    await store.put_hazard_space(space("v1"))
    await store.put_hazard_space(space("v2"))
    record = investigation("i1").model_copy(
        update={
            "trigger": HazardEvent(
                rule="torque_spike",
                severity="critical",
                session_id="s1",
                at=T0,
                summary="knee_motor.torque z=5.2",
                evidence=(sample(1, 2.5),),
            )
        }
    )
    await store.save_investigation(record)

    async def save(**changes: Any) -> None:
        nonlocal record
        record = record.model_copy(update=changes)
        await store.save_investigation(record)

    await save(state=InvestigationState.RUNNING)
    await store.append_event(event("i1", EventKind.STARTED))
    # Committed while the runner reads the session: inside the read window.
    await store.commit_ingest([message(4, content=UMLAUT)])
    await save(incident="Reported: torque spike")
    await store.append_event(
        event("i1", EventKind.PHASE_BEGUN).model_copy(update={"phase": Phase.SELF_ASSESSMENT})
    )
    await store.record_exchange("i1", exchange("report"))
    await save(reports={"planner": {"role_fulfilled": True}, "controller": None})
    await store.record_exchange("i1", exchange("vote"))
    vote = Vote(agent_id="planner", location=(0, 1), weight=0.75, justification="motor")
    await save(votes=(vote,))
    await store.append_event(event("i1", EventKind.VOTE_CAST).model_copy(update={"vote": vote}))
    await save(
        state=InvestigationState.SUCCEEDED,
        finished_at=T0 + timedelta(seconds=40),
        hazard_space=space("v2"),
        attribution=Attribution(
            scores=(0.0, 0.75),
            top=(1,),
            tie=False,
            decision=(0, 1),
            rule="argmax",
            beta=0.25,
        ),
        phases=(PhaseTiming(phase=Phase.VOTING, seconds=1.5),),
    )
    await store.append_event(event("i1", EventKind.ATTRIBUTION_READY))
    # After the investigation: not part of what it saw.
    await store.commit_ingest(
        [message(5), SessionEnd(session_id="s1", ended_at=T0 + timedelta(minutes=5))]
    )
    await store.save_investigation(investigation("i2"))


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def written(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StoreDb]:
    """One database per adapter, written once per module, in the order the runner writes; tests
    copy it."""
    db: StoreDb
    server: PostgresServer | None = None
    if request.param == "sqlite":
        db = SqliteDb(tmp_path_factory.mktemp("written") / "poirotd.db")
    else:
        server = request.getfixturevalue("postgres")
        db = PostgresDb(server.create_database())

    async def write() -> None:
        store = await db.open()
        try:
            await write_as_the_runner(store)
        finally:
            await store.close()

    asyncio.run(write())
    yield db
    if server is not None:
        server.drop_database(db.target)


@pytest.fixture
def db(written: StoreDb, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StoreDb]:
    if isinstance(written, SqliteDb):
        copy = tmp_path / "poirotd.db"
        with closing(sqlite3.connect(written.path)) as src, closing(sqlite3.connect(copy)) as dst:
            src.backup(dst)
        yield SqliteDb(copy)
        return
    assert isinstance(written, PostgresDb)
    server: PostgresServer = request.getfixturevalue("postgres")
    url = server.create_database(template=written.target.rpartition("/")[2])
    yield PostgresDb(url)
    server.drop_database(url)


def query(db: StoreDb, sql: str, *params: object) -> list[tuple[Any, ...]]:
    return db.query(sql, *params)


def latest_seq(db: StoreDb, kind: str, ref: str) -> int:
    ((seq,),) = query(db, "SELECT max(seq) FROM audit WHERE kind = ? AND ref = ?", kind, ref)
    assert seq is not None
    return int(seq)


def tamper(db: StoreDb, sql: str, *params: object) -> None:
    """Runs `sql` as someone with write access to the database: the append-only guard goes
    first."""
    db.tamper(sql, *params)


def flip(db: StoreDb, table: str, column: str, where: str, old: str, new: str) -> None:
    """Changes one character: `old` and `new` differ in exactly one place."""
    assert len(old) == len(new) and sum(a != b for a, b in zip(old, new, strict=True)) == 1
    ((value,),) = query(db, f"SELECT {column} FROM {table} WHERE {where}")
    assert value.count(old) == 1
    tamper(db, f"UPDATE {table} SET {column} = ? WHERE {where}", value.replace(old, new))


# ------------------------------------------------------------ intact


def test_every_record_write_is_chained_and_the_store_verifies(db: StoreDb) -> None:
    counts = dict(query(db, "SELECT kind, count(*) FROM audit GROUP BY kind"))
    assert counts == {
        "session": 2,  # start, end
        "message_block": 3,  # one per commit with new messages: 0-3, 4, 5 (resent 1 ignored)
        "telemetry_block": 2,  # one per commit with samples
        "hazard_space": 2,
        "investigation": 7,  # i1 saved six times, i2 once
        "event": 4,
        "exchange": 2,
    }
    ((entries, last_seq, last_hash),) = query(
        db,
        "SELECT count(*), max(seq), (SELECT hash FROM audit ORDER BY seq DESC LIMIT 1) FROM audit",
    )
    report = verify(db.target)
    assert report.ok, report.summary()
    assert (report.entries, report.head) == (entries, ChainHead(last_seq, last_hash))
    assert report.rows == 1 + 3 + 2 + 2 + 2 + 4 + 2
    assert report.summary().startswith(f"ok: {entries} entries chained, 16 rows match them")


@pytest.mark.parametrize("written", ["postgres"], indirect=True)
async def test_both_adapters_chain_the_same_entries_byte_for_byte(
    db: StoreDb, tmp_path: Path
) -> None:
    """The same writes give the same chain on PostgreSQL as on SQLite: records, refs, ids and
    therefore every hash."""
    reference = SqliteDb(tmp_path / "reference.db")
    store = await reference.open()
    try:
        await write_as_the_runner(store)
    finally:
        await store.close()
    entries = "SELECT seq, kind, ref, payload, prev_hash, hash FROM audit ORDER BY seq"
    assert db.query(entries) == reference.query(entries)
    assert len(reference.query(entries)) == 22


def test_verify_reads_without_writing(db: StoreDb) -> None:
    if not isinstance(db, SqliteDb):
        pytest.skip("a file's bytes: PostgreSQL's verify runs in a READ ONLY transaction")
    before = db.path.read_bytes()
    assert verify(db.target).ok
    assert db.path.read_bytes() == before


# ------------------------------------------------------------ one changed byte


def test_the_audit_table_refuses_updates_and_deletes(db: StoreDb) -> None:
    for sql in ("UPDATE audit SET kind = 'x'", "DELETE FROM audit"):
        with pytest.raises((sqlite3.IntegrityError, psycopg.Error), match="append-only"):
            db.query(sql)


@pytest.mark.parametrize(
    ("table", "column", "where", "old", "new", "kind", "ref", "problem"),
    [
        (
            "message_blocks",
            "record",
            "id = 1",
            "message 2",
            "message 3",
            "message_block",
            "1",
            "its record differs from its latest entry's payload from character",
        ),
        (
            "investigations",
            "record",
            "investigation_id = 'i1'",
            '"torque spike"',
            '"torque spika"',
            "investigation",
            "i1",
            "its record differs",
        ),
        (
            "exchanges",
            "record",
            "id = 2",
            "what happened",
            "what happenes",
            "exchange",
            "i1/2",
            "its record differs",
        ),
        (
            "sessions",
            "record",
            "session_id = 's1'",
            '"cortex"',
            '"cortey"',
            "session",
            "s1",
            "its record differs",
        ),
        (
            "telemetry_blocks",
            "record",
            "id = 2",
            ",2.5,",
            ",2.6,",
            "telemetry_block",
            "2",
            "its record differs",
        ),
        (
            "events",
            "record",
            "event_id = 3",
            '"weight":0.75',
            '"weight":0.95',
            "event",
            "3",
            "its record differs",
        ),
        (
            "investigations",
            "state",
            "investigation_id = 'i1'",
            "succeeded",
            "succeedex",
            "investigation",
            "i1",
            "state is 'succeedex', its record gives 'succeeded'",
        ),
    ],
)
def test_a_changed_character_in_a_record_table_is_named(
    db: StoreDb,
    table: str,
    column: str,
    where: str,
    old: str,
    new: str,
    kind: str,
    ref: str,
    problem: str,
) -> None:
    flip(db, table, column, where, old, new)
    report = verify(db.target)
    assert not report.ok and report.broken is not None
    assert (report.broken.seq, report.broken.kind, report.broken.ref) == (
        latest_seq(db, kind, ref),
        kind,
        ref,
    )
    assert report.broken.problem.startswith(problem), report.broken.problem


def test_making_an_older_hazard_space_the_latest_is_caught(db: StoreDb) -> None:
    tamper(db, "UPDATE hazard_spaces SET put_seq = put_seq + 1000 WHERE version = 'v1'")
    report = verify(db.target)
    assert report.broken is not None
    assert (report.broken.kind, report.broken.ref) == ("hazard_space", '["cortex","v1"]')
    assert report.broken.problem.startswith("put_seq is ")


@pytest.mark.parametrize(
    ("column", "problem"),
    [
        ("payload", "its hash does not match its kind, ref and payload"),
        ("hash", "its hash does not match its kind, ref and payload"),
        ("prev_hash", "its prev_hash is not the hash of seq"),
        ("ref", "its hash does not match its kind, ref and payload"),
    ],
)
def test_a_changed_character_in_the_chain_breaks_it_there(
    db: StoreDb, column: str, problem: str
) -> None:
    seq = latest_seq(db, "message_block", "1")
    ((value,),) = query(db, f"SELECT {column} FROM audit WHERE seq = ?", seq)
    if column == "payload":
        changed = value.replace("message 2", "message 3")
    else:
        changed = ("1" if value[0] == "0" else "0") + value[1:]
    tamper(db, f"UPDATE audit SET {column} = ? WHERE seq = ?", changed, seq)
    report = verify(db.target)
    assert report.broken is not None
    assert (report.broken.seq, report.broken.problem[: len(problem)]) == (seq, problem)
    assert report.entries == seq - 1


def test_of_two_changes_the_one_with_the_lower_seq_is_named(db: StoreDb) -> None:
    flip(
        db,
        "investigations",
        "record",
        "investigation_id = 'i1'",
        '"torque spike"',
        '"torque spika"',
    )
    flip(db, "message_blocks", "record", "id = 1", "message 0", "message 9")
    report = verify(db.target)
    assert report.broken is not None
    assert (report.broken.kind, report.broken.ref) == ("message_block", "1")


# ------------------------------------------------------------ removed and added rows


def test_a_deleted_record_row_is_named(db: StoreDb) -> None:
    tamper(db, "DELETE FROM message_blocks WHERE id = 2")
    report = verify(db.target)
    assert report.broken is not None
    assert (report.broken.seq, report.broken.kind, report.broken.ref) == (
        latest_seq(db, "message_block", "2"),
        "message_block",
        "2",
    )
    assert report.broken.problem == "its row is missing from message_blocks"


def test_a_deleted_entry_breaks_the_chain_after_it(db: StoreDb) -> None:
    seq = latest_seq(db, "message_block", "1")
    tamper(db, "DELETE FROM audit WHERE seq = ?", seq)
    report = verify(db.target)
    assert report.broken is not None
    assert (report.broken.seq, report.broken.problem) == (
        seq + 1,
        f"the entries before it are missing: {seq}",
    )


def test_a_cut_off_tail_is_caught_by_its_row_or_by_an_anchor(db: StoreDb) -> None:
    head = verify(db.target).head
    assert head is not None
    tamper(db, "DELETE FROM audit WHERE seq = ?", head.seq)  # the save of i2
    report = verify(db.target)
    assert report.broken is not None
    assert (report.broken.seq, report.broken.ref) == (None, "i2")
    assert report.broken.problem == "the row has no audit entry"

    tamper(db, "DELETE FROM investigations WHERE investigation_id = 'i2'")
    assert verify(
        db.target
    ).ok  # row and entry gone together: only an anchor kept elsewhere shows it
    anchored = verify(db.target, anchor=head)
    assert anchored.broken is not None
    assert (
        anchored.broken.problem == f"the chain ends at seq {head.seq - 1}, before the anchor {head}"
    )


def test_an_anchor_must_match_the_entry_at_its_seq(db: StoreDb) -> None:
    head = verify(db.target).head
    assert head is not None
    assert verify(db.target, anchor=head).ok
    forged = ChainHead(head.seq, "f" * 64)
    report = verify(db.target, anchor=forged)
    assert report.broken is not None
    assert report.broken.problem == f"its hash is not the anchor's {'f' * 64}"


async def test_published_checkpoints_catch_a_cut_off_chain(db: StoreDb, tmp_path: Path) -> None:
    """Without them, a tail cut off with its rows verifies (the test above)."""
    store = await db.open()
    metrics = Metrics("cortex")
    path = tmp_path / "checkpoints.jsonl"
    checkpoints = ChainCheckpoints(store, path, metrics, interval=60)
    try:
        await checkpoints.write()
        await checkpoints.write()  # the head did not move: no second line
        await store.commit_ingest([session("late")])
        await checkpoints.write()
    finally:
        await store.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    head = verify(db.target).head
    assert head is not None and len(lines) == 2
    assert (lines[-1]["seq"], lines[-1]["hash"]) == (head.seq, head.hash)
    exported = metrics.registry.get_sample_value(
        "poirot_audit_chain_head_seq", {"system": "cortex"}
    )
    assert exported == head.seq
    runner = CliRunner()
    command = ["audit", "verify", *db.cli_args(), "--checkpoints", str(path)]
    assert runner.invoke(app, command).exit_code == 0

    tamper(db, "DELETE FROM audit WHERE seq = ?", head.seq)
    tamper(db, "DELETE FROM sessions WHERE session_id = 'late'")
    assert verify(db.target).ok
    cut = runner.invoke(app, command)
    assert cut.exit_code == 1
    assert f"the chain ends at seq {head.seq - 1}, before the anchor {head}" in cut.stderr


def test_a_checkpoint_file_that_holds_none_exits_2(db: StoreDb, tmp_path: Path) -> None:
    empty = tmp_path / "none.jsonl"
    empty.write_text("\n")
    result = CliRunner().invoke(
        app, ["audit", "verify", *db.cli_args(), "--checkpoints", str(empty)]
    )
    assert result.exit_code == 2 and "holds no checkpoint" in result.stderr


def test_an_added_row_without_entry_is_named(db: StoreDb) -> None:
    ((record,),) = query(db, "SELECT record FROM message_blocks WHERE id = 3")
    tamper(db, "INSERT INTO message_blocks (id, session_id, record) VALUES (99, 's1', ?)", record)
    report = verify(db.target)
    assert report.broken is not None
    assert (report.broken.seq, report.broken.kind, report.broken.ref) == (
        None,
        "message_block",
        "99",
    )


async def test_a_refused_write_leaves_no_entry_and_the_chain_goes_on(db: StoreDb) -> None:
    store = await db.open()
    try:
        with pytest.raises(ValueError, match="not known"):
            await store.record_exchange("ghost", exchange("vote"))
        with pytest.raises(ValueError, match="Out of range float"):
            await store.commit_ingest([message(6), sample(2, float("nan"))])
        await store.commit_ingest([message(6)])
    finally:
        await store.close()
    report = verify(db.target)
    assert report.ok, report.summary()
    assert report.entries == 23  # the 22 written before, and message 6 once


# ------------------------------------------------------------ export


def envelopes(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        report["investigation"],
        *report["earlier_versions"],
        report["session"],
        report["hazard_space"],
        *report["messages"]["entries"],
        *report["exchanges"],
        *report["events"],
        *report["reputation_updates"],
    ]


def test_export_holds_what_the_investigation_saw_and_did(db: StoreDb) -> None:
    report = export_investigation(db.target, "i1")
    inv = report["investigation"]["record"]
    assert (inv["state"], inv["session_id"], inv["system"]) == ("succeeded", "s1", "cortex")
    assert inv["votes"] == [
        {
            "agent_id": "planner",
            "location": [0, 1],
            "hazard_vector": "",
            "justification": "motor",
            "weight": 0.75,
            "abstention_reason": "",
            "forced": False,
            "forced_by": "",
            "step": None,
        }
    ]
    assert inv["attribution"]["rule"] == "argmax"
    assert inv["reports"] == {"planner": {"role_fulfilled": True}, "controller": None}
    assert inv["phases"] == [{"phase": "voting", "seconds": 1.5}]
    assert inv["trigger"]["evidence"][0]["value"] == 2.5
    assert [v["record"]["state"] for v in report["earlier_versions"]] == [
        "queued",
        *["running"] * 4,
    ]
    assert report["session"]["record"]["ended_at"] is not None
    assert report["hazard_space"]["record"]["version"] == "v2"
    assert [e["record"]["kind"] for e in report["events"]] == [
        "started",
        "phase_begun",
        "vote_cast",
        "attribution_ready",
    ]
    assert [x["record"]["purpose"] for x in report["exchanges"]] == ["report", "vote"]
    assert report["exchanges"][0]["record"]["messages"][1]["content"] == "what happened?"
    assert report["exchanges"][0]["record"]["prompt_tokens"] == 812

    messages = report["messages"]
    # Message 4 came between the STARTED event and the next write: inside the read window;
    # message 5 came after the investigation and is left out.
    fields = messages["block_fields"]
    assert [e["kind"] for e in messages["entries"]] == ["message_block"] * 2
    seen = [
        dict(zip(fields, m, strict=True))
        for e in messages["entries"]
        for m in e["record"]["messages"]
    ]
    assert [m["index"] for m in seen] == [0, 1, 2, 3, 4]
    assert messages["read_after_seq"] == report["events"][0]["seq"]
    assert messages["read_after_seq"] < messages["entries"][1]["seq"] < messages["read_before_seq"]
    assert seen[4]["content"] == UMLAUT

    head = verify(db.target).head
    assert head is not None
    assert report["chain"]["head"] == {"seq": head.seq, "hash": head.hash}


def test_a_reader_can_re_hash_every_exported_record(db: StoreDb, tmp_path: Path) -> None:
    out = tmp_path / "i1.json"
    result = CliRunner().invoke(app, ["audit", "export", "i1", *db.cli_args(), "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text(encoding="utf-8"))
    entries = envelopes(report)
    assert len(entries) == 1 + 5 + 1 + 1 + 2 + 2 + 4
    for entry in entries:
        # As the export tells a reader to, with nothing of poirotd's but entry_hash.
        payload = json.dumps(
            entry["record"], sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        assert entry_hash(entry["prev_hash"], entry["kind"], entry["ref"], payload) == entry["hash"]
    # ...and the database still holds the chain the export was taken from.
    anchor = f"{report['chain']['head']['seq']}:{report['chain']['head']['hash']}"
    result = CliRunner().invoke(app, ["audit", "verify", *db.cli_args(), "--anchor", anchor])
    assert result.exit_code == 0, result.output


async def test_export_holds_the_beta_moves_of_the_investigations_confirmation(db: StoreDb) -> None:
    assert export_investigation(db.target, "i1")["reputation_updates"] == []

    def reassess(
        history: Sequence[Investigation], stored: dict[str, AgentReputation]
    ) -> list[AgentReputation]:
        inv = history[-1]
        return [
            AgentReputation(
                system=inv.system,
                agent_id=agent,
                beta=beta,
                confirmations=1,
                investigation_id=inv.investigation_id,
                updated_at=T0,
            )
            for agent, beta in (("planner", 0.3), ("controller", 0.2))
        ]

    store = await db.open()
    try:
        outcome = ConfirmedOutcome(region_ids=("knee_motor",), decision=(0, 1), note="", at=T0)
        await store.confirm_outcome("i1", outcome, reassess)
    finally:
        await store.close()
    report = export_investigation(db.target, "i1")
    updates = report["reputation_updates"]
    assert [(u["record"]["agent_id"], u["record"]["beta"]) for u in updates] == [
        ("planner", 0.3),
        ("controller", 0.2),
    ]
    assert report["investigation"]["record"]["confirmed"]["region_ids"] == ["knee_motor"]
    for entry in envelopes(report):
        payload = canonical_json(entry["record"])
        assert entry_hash(entry["prev_hash"], entry["kind"], entry["ref"], payload) == entry["hash"]
    assert export_investigation(db.target, "i2")["reputation_updates"] == []


def test_an_investigation_that_never_ran_saw_no_messages(db: StoreDb) -> None:
    report = export_investigation(db.target, "i2")
    assert report["messages"]["entries"] == []
    assert report["messages"]["read_after_seq"] is report["messages"]["read_before_seq"] is None
    assert (report["earlier_versions"], report["events"], report["hazard_space"]) == ([], [], None)


def test_export_of_an_unknown_investigation_is_refused(db: StoreDb) -> None:
    with pytest.raises(AuditError, match="'nope' is not in"):
        export_investigation(db.target, "nope")


# ------------------------------------------------------------ command line


def test_cli_verify_exit_codes(db: StoreDb, tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["audit", "verify", *db.cli_args()])
    assert ok.exit_code == 0
    assert ok.stdout.startswith("ok: ") and ok.stdout.count("\n") == 1

    flip(db, "message_blocks", "record", "id = 1", "message 2", "message 3")
    broken = runner.invoke(app, ["audit", "verify", *db.cli_args()])
    assert broken.exit_code == 1
    seq = latest_seq(db, "message_block", "1")
    assert broken.stderr.startswith(f"BROKEN at seq {seq} (message_block 1): its record differs")

    missing = runner.invoke(app, ["audit", "verify", "--db", str(tmp_path / "nope.db")])
    assert missing.exit_code == 2 and "no such database file" in missing.stderr
    bad_anchor = runner.invoke(app, ["audit", "verify", *db.cli_args(), "--anchor", "12"])
    assert bad_anchor.exit_code == 2 and "SEQ:HASH" in bad_anchor.stderr


def test_cli_export_writes_json_to_stdout(db: StoreDb) -> None:
    result = CliRunner().invoke(app, ["audit", "export", "i2", *db.cli_args()])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["investigation"]["ref"] == "i2"
    unknown = CliRunner().invoke(app, ["audit", "export", "nope", *db.cli_args()])
    assert unknown.exit_code == 2 and "'nope' is not in" in unknown.stderr


# ------------------------------------------------------------ migration from schema 1

# The schema and rows exactly as poirotd wrote them before the audit chain.
_V1_SCHEMA = """
CREATE TABLE sessions (session_id TEXT PRIMARY KEY, system TEXT NOT NULL,
    started_at TEXT NOT NULL, ended_at TEXT, labels TEXT NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (session_id), idx INTEGER NOT NULL,
    record TEXT NOT NULL, UNIQUE (session_id, idx));
CREATE TABLE telemetry (id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (session_id), measured_us INTEGER NOT NULL,
    record TEXT NOT NULL);
CREATE INDEX telemetry_by_session_time ON telemetry (session_id, measured_us, id);
CREATE TABLE hazard_spaces (system TEXT NOT NULL, version TEXT NOT NULL,
    put_seq INTEGER NOT NULL, record TEXT NOT NULL, PRIMARY KEY (system, version));
CREATE TABLE investigations (investigation_id TEXT PRIMARY KEY, system TEXT NOT NULL,
    session_id TEXT NOT NULL, state TEXT NOT NULL, created_us INTEGER NOT NULL,
    record TEXT NOT NULL);
CREATE INDEX investigations_by_time ON investigations (created_us, investigation_id);
CREATE INDEX investigations_by_session ON investigations (session_id, created_us, investigation_id);
CREATE INDEX investigations_by_state ON investigations (state, created_us, investigation_id);
CREATE TABLE events (event_id INTEGER PRIMARY KEY AUTOINCREMENT,
    investigation_id TEXT NOT NULL REFERENCES investigations (investigation_id),
    record TEXT NOT NULL);
CREATE INDEX events_by_investigation ON events (investigation_id, event_id);
CREATE TABLE exchanges (id INTEGER PRIMARY KEY,
    investigation_id TEXT NOT NULL REFERENCES investigations (investigation_id),
    record TEXT NOT NULL);
CREATE INDEX exchanges_by_investigation ON exchanges (investigation_id, id);
PRAGMA user_version = 1;
"""


def write_v1(db: Path) -> None:
    start = session(labels={"patient": "p7"})
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.executescript(_V1_SCHEMA)
        conn.execute(
            "INSERT INTO sessions VALUES (?, ?, ?, ?, ?)",
            ("s1", "cortex", start.started_at.isoformat(), None, json.dumps(start.labels)),
        )
        for i in range(3):
            conn.execute(
                "INSERT INTO messages (session_id, idx, record) VALUES (?, ?, ?)",
                ("s1", i, message(i).model_dump_json()),
            )
        conn.execute(
            "INSERT INTO telemetry (session_id, measured_us, record) VALUES (?, ?, ?)",
            ("s1", 1, sample(0, 1.0).model_dump_json()),
        )
        # v2 was put before v1 was put again: v1 is the latest, though its row came first.
        conn.execute(
            "INSERT INTO hazard_spaces VALUES ('cortex', 'v1', 3, ?)",
            (space("v1").model_dump_json(),),
        )
        conn.execute(
            "INSERT INTO hazard_spaces VALUES ('cortex', 'v2', 2, ?)",
            (space("v2").model_dump_json(),),
        )
        inv = investigation("i1", state=InvestigationState.SUCCEEDED)
        created_us = (T0 - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
        conn.execute(
            "INSERT INTO investigations VALUES ('i1', 'cortex', 's1', 'succeeded', ?, ?)",
            (created_us, inv.model_dump_json()),
        )
        conn.execute(
            "INSERT INTO events (investigation_id, record) VALUES ('i1', ?)",
            (event("i1").model_dump_json(exclude={"event_id"}),),
        )
        conn.execute(
            "INSERT INTO exchanges (investigation_id, record) VALUES ('i1', ?)",
            (exchange("vote").model_dump_json(),),
        )


async def test_a_schema_1_database_is_chained_at_migration(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    write_v1(db)
    with pytest.raises(AuditError, match="schema 1, from before the audit chain"):
        verify(db)

    store = await SqliteStore.open(db)
    try:
        assert await store.get_session("s1") == session(labels={"patient": "p7"})
        assert await store.session_messages("s1") == [message(0), message(1), message(2)]
        assert await store.latest_hazard_space("cortex") == space("v1")
        assert (await store.events_after(0))[0].event_id == 1
        assert await store.exchanges("i1") == [exchange("vote")]
        # The chain goes on from there; a resent message of the old rows is still ignored.
        await store.commit_ingest([message(2, content="resent"), message(3)])
        assert await store.session_messages("s1") == [message(i) for i in range(4)]
    finally:
        await store.close()

    report = verify(db)
    assert report.ok, report.summary()
    assert report.entries == 1 + 3 + 1 + 2 + 1 + 1 + 1 + 1
    assert query(
        SqliteDb(db), "SELECT seq, kind, ref FROM audit WHERE seq <= 2 OR kind = 'hazard_space'"
    ) == [
        (1, "session", "s1"),
        (2, "hazard_space", '["cortex","v2"]'),
        (3, "hazard_space", '["cortex","v1"]'),
    ]
    assert query(SqliteDb(db), "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    columns = query(SqliteDb(db), "PRAGMA table_info(sessions)")
    assert [c[1] for c in columns] == ["session_id", "record"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("DROP TABLE exchanges", "cannot be read: no such table: exchanges"),
        (
            f"PRAGMA user_version = {SCHEMA_VERSION + 1}",
            f"schema version {SCHEMA_VERSION + 1}; this poirotd audits version {SCHEMA_VERSION}",
        ),
    ],
)
@pytest.mark.parametrize("written", ["sqlite"], indirect=True)
def test_a_database_that_cannot_be_audited_exits_2(db: StoreDb, damage: str, message: str) -> None:
    tamper(db, damage)
    result = CliRunner().invoke(app, ["audit", "verify", *db.cli_args()])
    assert result.exit_code == 2 and message in result.stderr
    with pytest.raises(AuditError, match=message):
        verify(db.target)


def test_a_file_that_is_not_a_database_exits_2(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite" * 100)
    result = CliRunner().invoke(app, ["audit", "export", "i1", "--db", str(junk)])
    assert result.exit_code == 2 and "cannot be read: file is not a database" in result.stderr
