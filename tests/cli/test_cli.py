"""The command line as an operator meets it: exit codes and messages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from poirotd.demo.main import demo_file
from tests.support.cli import poirotd


def test_check_config_accepts_the_demo_spec() -> None:
    result = poirotd("check-config", str(demo_file("cortex.yaml")))
    assert result.returncode == 0, result.stderr
    assert "system 'cortex', 3 agents" in result.stdout


def test_check_config_names_field_and_line_of_each_problem(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        "system:\n"
        "  name: clinic\n"
        "  description: a system\n"
        "agents:\n"
        "  - id: doctor\n"
        "    name: Doctor\n"
        "  - id: Chief\n"
        "    name: Chief\n"
        "    system_prompt: You choose.\n"
        "protocol:\n"
        "  beta: 0.9\n"
    )
    result = poirotd("check-config", str(spec))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert f"{spec}:5: agents[0].system_prompt: Field required" in lines
    assert any(
        line.startswith(f"{spec}:7: agents[1].id: String should match pattern") for line in lines
    )
    assert any(
        line.startswith(f"{spec}:11: protocol.beta: Input should be less than or equal")
        for line in lines
    )


def test_run_refuses_an_invalid_spec_before_starting(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("system: [not, a, mapping]\n")
    result = poirotd("run", "--config", str(spec), "--db", str(tmp_path / "db.sqlite"))
    assert result.returncode == 2
    assert f"{spec}:1: system" in result.stderr
    assert not (tmp_path / "db.sqlite").exists()


@pytest.mark.parametrize("blocked", ["poirot_eval", "pyarrow", "matplotlib"])
@pytest.mark.parametrize("command", [["eval", "run", "--help"], ["replay", "whowhen:1"]])
def test_evaluation_commands_without_the_eval_extra_say_how_to_install_it(
    blocked: str, command: list[str]
) -> None:
    """A core install: the harness or one of its libraries cannot be imported. One line naming
    the extra, exit 2, no traceback."""
    script = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        "from poirotd.cli.main import app\n"
        "app(prog_name='poirotd')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, *command], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(f"poirotd {command[0]} needs the eval extra (no module '{blocked}")
    assert line.endswith("): pip install 'poirotd[eval]'")
    assert result.stdout == ""


def test_eval_runs_the_harness_commands_with_their_own_options() -> None:
    result = poirotd("eval", "run", "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage: poirotd eval run [OPTIONS]" in result.stdout
    assert "--concurrency" in result.stdout
    bad = poirotd("eval", "run", "--dataset", "nope", "--out", "unused")
    assert bad.returncode == 2
    assert "'nope' is not one of" in bad.stderr


def test_run_names_an_llm_ca_file_it_cannot_read(tmp_path: Path) -> None:
    spec = tmp_path / "vllm.yaml"
    data = yaml.safe_load(demo_file("cortex.yaml").read_text())
    data["llm"] = {
        "backend": "openai",
        "base_urls": ["https://vllm.mas.svc:8000"],
        "model": "qwen",
        "tls": {"ca_file": "/nonexistent/internal-ca.crt"},
    }
    spec.write_text(yaml.safe_dump(data))
    result = poirotd("run", "--config", str(spec), "--db", str(tmp_path / "db.sqlite"))
    assert result.returncode == 2, result.stderr
    assert "tls.ca_file /nonexistent/internal-ca.crt" in result.stderr
    assert "Traceback" not in result.stderr
