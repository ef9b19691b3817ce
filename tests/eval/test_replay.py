"""Replay into a daemon over loopback gRPC: in process with a scripted LLM (fast), and end to end as
an operator runs it, `poirotd eval spec` then `poirotd run` then `poirotd replay` (slow)."""

from __future__ import annotations

import io
import json
import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from rich.console import Console

from poirot_eval.replay import pauses, replay
from poirot_eval.selection import resolve_case
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.config import SystemSpec
from poirotd.config.loader import load_spec
from poirotd.daemon import Daemon
from poirotd.devtools.process import DaemonProcess
from tests.eval.helpers import case
from tests.support.cli import poirotd
from tests.support.data import DATA


@pytest.fixture
def daemon_spec() -> SystemSpec:
    return case("1").spec


async def test_replay_streams_the_session_and_follows_the_investigation(daemon: Daemon) -> None:
    out = io.StringIO()
    investigation = await replay(
        case("1"),
        f"127.0.0.1:{daemon.grpc_port}",
        session_id="replayed",
        speed=1.0,
        interval=0.0,
        trigger=True,
        watch=True,
        method="baseline",
        console=Console(file=out, width=200),
    )

    assert investigation is not None
    assert investigation.state == pb.INVESTIGATION_STATE_SUCCEEDED
    assert investigation.method == "baseline"
    assert investigation.session_id == "replayed"
    text = out.getvalue()
    assert "[3/3] agent doctor" in text
    assert "5 items sent, durable up to 5" in text
    assert "attribution ready" in text
    with sqlite3.connect(daemon.settings.db_path) as db:
        rows = db.execute(
            "SELECT COUNT(*) FROM agent_messages WHERE session_id = 'replayed'"
        ).fetchone()
    assert rows == (3,)


async def test_replay_without_trigger_only_streams(daemon: Daemon) -> None:
    result = await replay(
        case("1"),
        f"127.0.0.1:{daemon.grpc_port}",
        session_id="quiet",
        speed=1.0,
        interval=0.0,
        trigger=False,
        watch=False,
        method="poirot",
        console=Console(file=io.StringIO()),
    )
    assert result is None


def test_pauses_compress_recorded_gaps_or_use_the_interval() -> None:
    c = case("1")
    assert pauses(c, speed=4.0, interval=None) == [0.0, 0.25, 0.25]
    assert pauses(c, speed=4.0, interval=2.0) == [0.0, 2.0, 2.0]
    backwards = c.model_copy(
        update={
            "messages": (
                c.messages[0],
                c.messages[1].model_copy(update={"sent_at": c.messages[0].sent_at - timedelta(1)}),
            )
        }
    )
    assert pauses(backwards, speed=1.0, interval=None) == [0.0, 0.0]


def test_a_case_is_named_by_dataset_and_id_or_by_a_case_file(tmp_path: Path) -> None:
    path = tmp_path / "case.json"
    path.write_text(case("7").model_dump_json())
    assert resolve_case(str(path), DATA) == case("7")
    with pytest.raises(ValueError, match="neither DATASET:CASE_ID"):
        resolve_case("nowhere:1", DATA)
    whowhen = resolve_case("whowhen:1", DATA)
    assert (whowhen.dataset, whowhen.case_id) == ("whowhen", "1")
    with pytest.raises(ValueError, match=r"whowhen:9999: no case \['9999'\] in .*Algorithm-Gen"):
        resolve_case("whowhen:9999", DATA)


def test_eval_spec_writes_a_spec_the_daemon_loads(tmp_path: Path) -> None:
    path = tmp_path / "case.json"
    path.write_text(case("1").model_dump_json())
    result = poirotd("eval", "spec", str(path), "-o", str(tmp_path / "spec.yaml"))
    assert result.returncode == 0, result.stderr
    assert load_spec(tmp_path / "spec.yaml") == case("1").spec


@pytest.mark.slow
@pytest.mark.timeout(900)  # 5.5 s on a quiet 2-core box; the replay has 600 s of its own
def test_replay_into_a_daemon_process_started_on_the_case_spec(tmp_path: Path) -> None:
    """The operator's path on real parts: the embedded model answers (meaningless, valid)."""
    case_file = tmp_path / "case.json"
    case_file.write_text(case("1").model_dump_json())
    spec = tmp_path / "spec.yaml"
    assert poirotd("eval", "spec", str(case_file), "-o", str(spec)).returncode == 0
    with DaemonProcess(spec, tmp_path) as process:
        result = poirotd(
            "replay", str(case_file), "--target", process.grpc_target,
            "--interval", "0.05", "--watch", "--method", "baseline", "--session-id", "op-1",
            timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr + process.log_tail()
    assert "attribution ready" in result.stdout
    with sqlite3.connect(process.db_path) as db:
        [(record,)] = db.execute(
            "SELECT record FROM investigations WHERE session_id = 'op-1'"
        ).fetchall()
    assert json.loads(record)["method"] == "baseline"
