"""deploy/Dockerfile, checked without Docker (no daemon, no registry here): the instructions
that matter, the extras switch, and that the build context it sees is enough to build poirotd."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from poirotd.config import Settings
from tests.support.deploy import DEPLOY, REPO

DOCKERFILE = DEPLOY / "Dockerfile"
IGNORE_FILE = DEPLOY / "Dockerfile.dockerignore"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def _final_stage() -> list[tuple[str, str]]:
    instructions = _instructions()
    last_from = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    return instructions[last_from:]


def test_runtime_stage_user_ports_entrypoint_and_no_healthcheck() -> None:
    stage = dict(_final_stage())
    assert ("ARG", "PYTHON_IMAGE=python:3.11-slim") in _instructions()
    assert stage["USER"] == "10001:10001", "numeric non-root user (runAsNonRoot can check it)"
    defaults = Settings()
    assert stage["EXPOSE"].split() == [str(defaults.grpc_port), str(defaults.metrics_port)]
    assert stage["ENTRYPOINT"] == '["poirotd", "run", "--config", "/etc/poirotd/system.yaml"]'
    assert stage["HEALTHCHECK"] == "NONE"
    env = dict(item.split("=", 1) for item in stage["ENV"].split())
    assert env["POIROTD_GRPC_HOST"] == env["POIROTD_METRICS_HOST"] == "0.0.0.0"


def test_the_image_binds_all_interfaces_only_with_tls_from_the_mounted_secret() -> None:
    """Beyond loopback only with TLS: the certificate files are where deploy/k8s mounts the
    cert-manager Secret, and nothing opts out of the daemon's refusal of an unlocked bind."""
    env = dict(item.split("=", 1) for item in dict(_final_stage())["ENV"].split())
    assert env["POIROTD_TLS_CERT_FILE"] == "/run/secrets/poirotd/tls/tls.crt"
    assert env["POIROTD_TLS_KEY_FILE"] == "/run/secrets/poirotd/tls/tls.key"
    assert "POIROTD_ALLOW_INSECURE_BIND" not in env
    deployment = yaml.safe_load_all((DEPLOY / "k8s" / "mas-deployment.yaml").read_text())
    (mas,) = [d for d in deployment if d["kind"] == "Deployment"]
    (sidecar,) = [c for c in mas["spec"]["template"]["spec"]["initContainers"]]
    mounts = {m["mountPath"] for m in sidecar["volumeMounts"]}
    assert str(Path(env["POIROTD_TLS_CERT_FILE"]).parent) in mounts


@pytest.mark.parametrize(("extras", "target"), [("", "."), ("embedded", ".[embedded]")])
def test_pip_install_target_follows_the_extras_build_arg(extras: str, target: str) -> None:
    (install,) = [args for op, args in _instructions() if op == "RUN" and "pip install" in args]
    argument = install.split("pip install", 1)[1].strip()
    result = subprocess.run(
        ["sh", "-c", f"printf %s {argument}"],
        env={"EXTRAS": extras},
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert result.stdout == target


def test_the_embedded_extra_exists_in_pyproject() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "embedded" in project["optional-dependencies"]


def _context_files() -> list[Path]:
    """The files BuildKit sends with deploy/Dockerfile.dockerignore (its `**` then `!`
    includes, then excludes form only)."""
    patterns = [
        line.strip()
        for line in IGNORE_FILE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "**", "the ignore file is an allow-list"
    kept = []
    for path in sorted(p for p in REPO.rglob("*") if p.is_file()):
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith((".git/", ".venv/")):
            continue
        included = False
        for pattern in patterns[1:]:
            negated = pattern.startswith("!")
            body = pattern.removeprefix("!").rstrip("/")
            hit = fnmatch.fnmatch(relative, body) or relative.startswith(body + "/")
            if body.startswith("**/"):
                name = body.removeprefix("**/")
                hit = any(fnmatch.fnmatch(part, name) for part in relative.split("/"))
            if hit:
                included = negated
        if included:
            kept.append(path)
    return kept


@pytest.mark.slow
@pytest.mark.timeout(600)  # 0.9 s on a quiet 2-core box; pip has 300 s of its own
def test_the_build_context_builds_a_wheel_with_the_package_data(tmp_path: Path) -> None:
    context = tmp_path / "context"
    for path in _context_files():
        target = context / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    assert not list(context.rglob("*.db")), "no local databases in the image"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "dist").glob("poirotd-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"poirotd/cli/main.py", "poirotd/demo/cortex.yaml"} <= names
    assert any(name.endswith("entry_points.txt") for name in names)
