"""Generates the Python for proto/poirot/v1 into poirotd/api, or checks that it is up to date.

grpc_tools emits absolute imports rooted at the proto path (`from poirot.v1 import ...`); they are
rewritten to live under this package so the generated code needs nothing on sys.path.
"""

from __future__ import annotations

import filecmp
import re
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto"
OUT_DIR = Path(__file__).resolve().parent
PACKAGE = "poirotd.api"
_IMPORT = re.compile(r"^from poirot(\.v\d+) import", re.MULTILINE)


def generate(out_dir: Path) -> list[Path]:
    """Runs protoc (with mypy stubs) into out_dir and returns the files written."""
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    bin_dir = Path(sys.executable).parent
    args = [
        "protoc",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"-I{PROTO_DIR}",
        f"-I{Path(protoc.__file__).parent / '_proto'}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    # Only what protoc wrote: an in-place run also finds __pycache__ beside it.
    written = sorted(p for p in (out_dir / "poirot").rglob("*.py*") if p.suffix in (".py", ".pyi"))
    for path in written:
        path.write_text(_IMPORT.sub(rf"from {PACKAGE}.poirot\1 import", path.read_text()))
    for package_dir in {p.parent for p in written} | {out_dir / "poirot"}:
        (package_dir / "__init__.py").touch()
    return written


def stale_files() -> list[str]:
    """Generated files that differ from what the current .proto files produce."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = []
        for path in fresh:
            rel = path.relative_to(tmp)
            current = OUT_DIR / rel
            if not current.exists() or not filecmp.cmp(path, current, shallow=False):
                stale.append(str(rel))
        return stale


def main() -> int:
    if "--check" in sys.argv[1:]:
        stale = stale_files()
        if stale:
            print(f"generated code is stale (run `make proto`): {', '.join(stale)}")
            return 1
        print("generated code is up to date")
        return 0
    for path in generate(OUT_DIR):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
