"""A flood of refused calls is counted in full, but costs the audit chain a bounded number of
rows: per peer and reason, the first refusal of a window, then one summary whose count holds
the rest; the summaries are chained like every row, and written at stop too."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import grpc

from poirotd.model import AccessDenial
from poirotd.observability.metrics import Metrics
from poirotd.store.audit import verify
from poirotd.store.chain import encode_record
from poirotd.transports.security.access import AccessDeniedError, DenialReason
from poirotd.transports.security.denials import OTHER_PEERS, DenialRecorder
from tests.support.pki import Pki, client, locked_daemon
from tests.support.stores import StoreDb

UNKNOWN_TOKEN = AccessDeniedError(DenialReason.UNKNOWN_TOKEN, "the bearer token is not known")


def chained(db: StoreDb) -> list[dict[str, object]]:
    """The access_denials rows' records, in order."""
    return [json.loads(r) for (r,) in db.query("SELECT record FROM access_denials ORDER BY id")]


def refusals(rows: Sequence[dict[str, object]]) -> int:
    """How many refused calls the rows stand for."""
    return sum(int(str(row.get("count", 1))) for row in rows)


async def test_500_bad_token_calls_in_a_burst_leave_two_chained_rows_that_count_them_all(
    tmp_path: Path, store_db: StoreDb
) -> None:
    pki = Pki.create(tmp_path / "pki")
    pki.write_access({"reader-token": ("dashboard", ["reader"])}, {})
    on_postgres = {"db_url": store_db.target} if store_db.name == "postgres" else {}
    async with (
        locked_daemon(tmp_path, pki, auth_file=pki.auth_file, **on_postgres) as daemon,
        client(daemon, pki.client_tls(), token="guessed-secret") as guesser,
    ):
        burst = await asyncio.gather(
            *(guesser.reputation() for _ in range(500)), return_exceptions=True
        )
        assert all(
            isinstance(e, grpc.aio.AioRpcError) and e.code() == grpc.StatusCode.UNAUTHENTICATED
            for e in burst
        )
        counted = daemon.metrics.registry.get_sample_value(
            "poirot_auth_denials_total",
            {"rpc": "Investigations.GetReputation", "reason": "unknown_token"},
        )
        assert counted == 500
    # The daemon stopped within the window: the summary was written at stop.
    rows = chained(store_db)
    assert len(rows) == 2 and refusals(rows) == 500
    first, summary = rows
    assert "count" not in first and str(first["peer"]).startswith("ipv4:127.0.0.1:")
    assert summary["count"] == 499 and summary["peer"] == "127.0.0.1"
    assert (
        summary["reason"] == "unknown_token" and summary["call"] == "Investigations.GetReputation"
    )
    assert str(summary["at"]) <= str(summary["until"])
    assert not any("guessed-secret" in json.dumps(row) for row in rows)
    report = verify(store_db.target)
    assert report.ok, report.summary()


async def test_each_window_costs_at_most_two_rows_and_a_new_one_opens_with_a_written_row(
    store_db: StoreDb,
) -> None:
    metrics = Metrics("clinic")
    store = await store_db.open()
    recorder = DenialRecorder(
        store, metrics, asyncio.get_running_loop(), window_seconds=0.3, max_summaries=16
    )

    def flood(calls: int) -> None:  # from another thread, as any transport may call
        for _ in range(calls):
            recorder.record(
                UNKNOWN_TOKEN, transport="metrics", call="GET /metrics", peer="10.0.0.9"
            )

    await asyncio.to_thread(flood, 200)
    await asyncio.sleep(0.6)  # the window closes: its summary is written
    await recorder.flush()
    assert [row.get("count", 1) for row in chained(store_db)] == [1, 199]
    await asyncio.to_thread(flood, 1)  # a new window: written at once, nothing to summarise
    await recorder.flush()
    await store.close()
    rows = chained(store_db)
    assert [row.get("count", 1) for row in rows] == [1, 199, 1] and refusals(rows) == 201
    assert verify(store_db.target).ok


async def test_more_peers_than_summaries_are_folded_into_other_peers(store_db: StoreDb) -> None:
    metrics = Metrics("clinic")
    store = await store_db.open()
    recorder = DenialRecorder(
        store, metrics, asyncio.get_running_loop(), window_seconds=60, max_summaries=2
    )
    for _ in range(10):
        for host in range(5):
            peer = f"ipv4:10.0.0.{host}:{40000 + host}"
            recorder.record(UNKNOWN_TOKEN, transport="grpc", call="Ingest.Stream", peer=peer)
    await recorder.flush()
    await store.close()

    rows = chained(store_db)
    assert refusals(rows) == 50
    by_peer = {str(row["peer"]): row.get("count", 1) for row in rows}
    # Two peers have their own window: a row and a summary each. The other three share one.
    assert by_peer == {
        "ipv4:10.0.0.0:40000": 1,
        "ipv4:10.0.0.1:40001": 1,
        "ipv4:10.0.0.2:40002": 1,  # the first refusal of "other peers", written as it was
        "10.0.0.0": 9,
        "10.0.0.1": 9,
        OTHER_PEERS: 29,
    }
    assert metrics.registry.get_sample_value("poirot_auth_denials_folded_total") == 30
    assert verify(store_db.target).ok


def test_a_single_refusals_record_leaves_the_summarys_fields_out() -> None:
    """It re-encodes byte for byte (what verify checks) without `count` and `until`."""
    single = (
        '{"at":"2026-01-01T00:00:00Z","call":"GET /metrics","identity":"","peer":"10.0.0.9",'
        '"reason":"unknown_token","role":"","transport":"metrics"}'
    )
    assert encode_record(AccessDenial.model_validate_json(single)) == single
    summary = AccessDenial.model_validate_json(single).model_copy(update={"count": 2})
    assert '"count":2' in encode_record(summary)
