"""The daemon on a PostgreSQL store (POIROTD_DB_URL): the whole path over gRPC on a real server,
two daemons sharing it, and a clear refusal when the database cannot be used."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.config import Settings
from poirotd.daemon import StoreUnavailableError, open_store
from poirotd.demo.main import demo_file
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.clinic import clinic
from poirotd.devtools.ingest_requests import OVERHEAT, message, motor_temp, session, start
from poirotd.llm.scripted import ScriptedBackend
from poirotd.store.audit import verify
from tests.support.cli import poirotd
from tests.support.daemon import client_of, in_process_daemon
from tests.support.stores import PostgresDb


async def test_a_rule_fires_and_its_investigation_is_stored_and_served(
    tmp_path: Path, postgres_url: str
) -> None:
    spec = clinic(rules=[OVERHEAT])
    backend = ScriptedBackend(schema_answer)
    async with (
        in_process_daemon(tmp_path, spec, backend, db_url=postgres_url) as daemon,
        client_of(daemon) as client,
    ):
        readings = [motor_temp(i * 0.1, 40.0 + 3 * i) for i in range(20)]  # over 70 from i = 11
        assert await client.send([*session(3), *readings]) == 4 + 20
        listed = await client.investigations.List(pb.ListInvestigationsRequest(session_id="s1"))
        (opened,) = listed.investigations
        assert opened.reason.startswith("rule exo_overheat: ")
        events = [e async for e in client.watch(opened.investigation_id)]
        assert events[0].HasField("started") and events[-1].HasField("attribution_ready")
        record = await client.get(opened.investigation_id)
        assert record.state == pb.INVESTIGATION_STATE_SUCCEEDED
    assert not (tmp_path / "poirotd.db").exists()  # the store was PostgreSQL only
    db = PostgresDb(postgres_url)
    assert db.query("SELECT investigation_id, state FROM investigations") == [
        (opened.investigation_id, "succeeded")
    ]
    assert db.query("SELECT count(*) FROM agent_messages") == [(3,)]
    assert db.query("SELECT count(*) FROM telemetry_samples") == [(20,)]
    assert db.query("SELECT count(*) FROM events") == [(len(events),)]
    report = verify(postgres_url)
    assert report.ok, report.summary()


async def test_a_session_started_through_one_daemon_takes_messages_through_another(
    tmp_path: Path, postgres_url: str
) -> None:
    spec = clinic()
    for folder in ("a", "b"):  # each daemon's own files: its audit checkpoints
        (tmp_path / folder).mkdir()
    async with (
        in_process_daemon(
            tmp_path / "a", spec, ScriptedBackend(schema_answer), db_url=postgres_url
        ) as first,
        in_process_daemon(
            tmp_path / "b", spec, ScriptedBackend(schema_answer), db_url=postgres_url
        ) as second,
        client_of(first) as to_first,
        client_of(second) as to_second,
    ):
        assert await to_first.send([start("shared")]) == 1
        messages = [message(i, session_id="shared") for i in range(3)]
        assert await to_second.send(messages) == 3
        queued = await to_second.trigger("shared", "asked through the other daemon")
        assert queued.investigation_id
    assert PostgresDb(postgres_url).query("SELECT count(*) FROM agent_messages") == [(3,)]


def test_run_exits_2_naming_the_setting_without_the_password(tmp_path: Path) -> None:
    spec = tmp_path / "cortex.yaml"
    data = yaml.safe_load(demo_file("cortex.yaml").read_text())
    del data["inputs"]
    spec.write_text(yaml.safe_dump(data))
    secret = "s3cret-pw"
    for url, problem in (
        (
            f"postgresql://poirot:{secret}@127.0.0.1:1/poirotd",
            "POIROTD_DB_URL: cannot use the database postgresql://poirot:***@127.0.0.1:1/poirotd",
        ),
        (f"postgresql://poirot:{secret}@host:port/db", "POIROTD_DB_URL: not a PostgreSQL URL"),
        (f"mysql://poirot:{secret}@host/db", "POIROTD_DB_URL: a PostgreSQL URL starts with"),
    ):
        result = poirotd("run", "--config", str(spec), env={"POIROTD_DB_URL": url})
        assert result.returncode == 2, result.stderr
        assert problem in result.stderr
        assert secret not in result.stderr + result.stdout
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "poirotd.db").exists()


async def test_a_password_libpq_cannot_decode_is_not_repeated_in_the_error(
    tmp_path: Path,
) -> None:
    """libpq quotes a percent-encoded token it cannot decode: a raw password holding `%`, in
    the URL's authority or in its `password` parameter, must not reach the error (a log line)."""
    for url, secret in (
        ("postgresql://poirot@127.0.0.1:1/db?password=pw%zz-secret", "pw%zz-secret"),
        ("postgresql://poirot:pw%zz-secret@127.0.0.1:1/db", "pw%zz-secret"),
    ):
        settings = Settings(db_path=tmp_path / "unused.db", db_url=url)
        with pytest.raises(StoreUnavailableError) as refused:
            await open_store(settings)
        assert "POIROTD_DB_URL: cannot use the database" in str(refused.value)
        assert secret not in str(refused.value)
