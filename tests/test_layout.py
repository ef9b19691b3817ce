"""The package layout's rules, read from the source: which package may import which, no import
cycle at module level, nothing loose at the top of poirotd/, the daemon's own dependencies free
of the evaluation harness's, tests that share only through tests/support, and benchmarks that
share with the tests only through poirotd/devtools."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# hwbridge is a client of poirotd: the domain types, the wire API, the client (its TLS and
# secrets included), the errors.
HWBRIDGE_MAY_IMPORT = ("poirotd.model", "poirotd.api", "poirotd.client", "poirotd.errors")
# Inside poirotd only these use hwbridge: the MQTT transport, and the demo that starts a broker.
MAY_IMPORT_HWBRIDGE = ("poirotd.transports.mqtt", "poirotd.demo")
# Inside poirotd only these use the development helpers: the helpers themselves and the demo.
MAY_IMPORT_DEVTOOLS = ("poirotd.devtools", "poirotd.demo")
TOP_OF_POIROTD = {"__init__", "__main__", "daemon", "model", "errors"}
# poirot_eval (the `eval` extra) sits above poirotd: it may import poirotd, never the reverse
# (`poirotd eval` / `poirotd replay` find its commands through an entry point, pyproject.toml).
EVAL_EXTRA = {"matplotlib", "pyarrow"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources(package: str) -> Iterator[Path]:
    yield from (p for p in (ROOT / package).rglob("*.py") if "api/poirot" not in p.as_posix())


def imports(path: Path, *, module_level_only: bool = False) -> Iterator[str]:
    """Absolute module names the file imports (`from a import b` gives a.b when b is a module,
    a otherwise); with `module_level_only`, not those inside functions or TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                known = (ROOT / candidate.replace(".", "/")).with_suffix(".py").exists() or (
                    ROOT / candidate.replace(".", "/") / "__init__.py"
                ).exists()
                yield candidate if known else node.module


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def importing_functions(path: Path, package: str) -> Iterator[str | None]:
    """For each import of `package` in the file, the name of the function it sits in (None at
    module level, or in a class body)."""

    def visit(node: ast.AST, function: str | None) -> Iterator[str | None]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            names = []
        yield from (function for name in names if within(name, (package,)))
        for child in ast.iter_child_nodes(node):
            yield from visit(child, function)

    yield from visit(ast.parse(path.read_text()), None)


def test_hwbridge_uses_only_poirotds_public_surface() -> None:
    wrong = {
        (module_name(path), name)
        for path in sources("hwbridge")
        for name in imports(path)
        if within(name, ("poirotd",)) and not within(name, HWBRIDGE_MAY_IMPORT)
    }
    assert not wrong, sorted(wrong)


def test_hwbridge_does_not_import_the_evaluation_harness() -> None:
    wrong = {
        (module_name(path), name)
        for path in sources("hwbridge")
        for name in imports(path)
        if within(name, ("poirot_eval",))
    }
    assert not wrong, sorted(wrong)


def test_poirotd_never_imports_poirot_eval() -> None:
    found = {
        (module_name(path), function)
        for path in sources("poirotd")
        for function in importing_functions(path, "poirot_eval")
    }
    assert not found, sorted(found, key=str)


def test_the_import_rules_see_an_import_inside_a_function(tmp_path: Path) -> None:
    source = tmp_path / "lazy.py"
    source.write_text("import typer\n\n\ndef later() -> None:\n    import poirot_eval.cli\n")
    assert set(importing_functions(source, "poirot_eval")) == {"later"}
    assert set(importing_functions(source, "typer")) == {None}


def test_the_core_dependencies_leave_the_evaluation_libraries_to_the_eval_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_requirement_name(r) for r in project["dependencies"]}
    extra = {_requirement_name(r) for r in project["optional-dependencies"]["eval"]}
    assert not core & EVAL_EXTRA, sorted(core & EVAL_EXTRA)
    assert extra == EVAL_EXTRA
    import poirot_eval

    assert set(poirot_eval.EXTRA_MODULES) == EVAL_EXTRA, "what poirot_eval checks on import"


def _requirement_name(requirement: str) -> str:
    """`pyarrow>=16,<27` -> pyarrow (the name ends at the first version or extras marker)."""
    for marker in "<>=!~[; ":
        requirement = requirement.split(marker, 1)[0]
    return requirement.lower()


def test_every_poirotd_module_imports_without_the_eval_extra() -> None:
    """What a core install (`pip install poirotd`) holds is enough for the daemon: every module
    of poirotd imports with poirot_eval, matplotlib and pyarrow made unimportable."""
    blocked = ["poirot_eval", *sorted(EVAL_EXTRA)]
    # __main__ would run the CLI
    modules = sorted(module_name(p) for p in sources("poirotd") if p.stem != "__main__")
    script = (
        "import importlib, sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr


def test_only_the_mqtt_transport_and_the_demo_import_hwbridge() -> None:
    wrong = {
        (module_name(path), name)
        for path in sources("poirotd")
        for name in imports(path)
        if within(name, ("hwbridge",)) and not within(module_name(path), MAY_IMPORT_HWBRIDGE)
    }
    assert not wrong, sorted(wrong)


def test_the_daemon_never_imports_the_development_helpers() -> None:
    wrong = {
        (module_name(path), name)
        for package in ("poirotd", "hwbridge", "poirot_eval")
        for path in sources(package)
        for name in imports(path)
        if within(name, ("poirotd.devtools",))
        and not within(module_name(path), MAY_IMPORT_DEVTOOLS)
    }
    assert not wrong, sorted(wrong)


@pytest.mark.parametrize("package", ["poirotd", "hwbridge", "poirot_eval", "bench"])
def test_only_the_tests_import_the_tests(package: str) -> None:
    """What the tests and the benchmarks both need lives in poirotd/devtools: a benchmark run
    from an installed package has no tests/ to import."""
    wrong = {
        (module_name(path), name)
        for path in sources(package)
        for name in imports(path)
        if within(name, ("tests",))
    }
    assert not wrong, sorted(wrong)


def test_nothing_loose_at_the_top_of_poirotd() -> None:
    loose = {path.stem for path in (ROOT / "poirotd").glob("*.py")} - TOP_OF_POIROTD
    assert not loose, sorted(loose)


def test_no_module_imports_a_test_module_or_a_conftest() -> None:
    """Shared helpers live in tests/support; a test module is not a library."""
    wrong = {
        (module_name(path), name)
        for package in ("tests", "bench")
        for path in sources(package)
        for name in imports(path)
        if within(name, ("tests",)) and name.rpartition(".")[2].startswith(("test_", "conftest"))
    }
    assert not wrong, sorted(wrong)


# bench too: a bench's section module (bench/sections/NAME.py) imports its measuring module's
# types for annotations only, so that bench/NAME.py may import its section.
@pytest.mark.parametrize("package", ["poirotd", "hwbridge", "poirot_eval", "bench"])
def test_no_import_cycle_at_module_level(package: str) -> None:
    graph: dict[str, set[str]] = {}
    for path in sources(package):
        name = module_name(path)
        graph[name] = {
            target
            for target in imports(path, module_level_only=True)
            if within(target, (package,)) and target != name
        }
    cycle = _find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of modules, if any (importing a package runs its __init__, so a module's edge to
    `a.b.c` also counts as edges to `a.b` and `a`)."""
    edges = {
        node: {
            prefix
            for target in targets
            for prefix in _prefixes(target)
            if prefix in graph and prefix != node and not node.startswith(prefix + ".")
        }
        for node, targets in graph.items()
    }
    done: set[str] = set()
    for start in edges:
        path: list[str] = []
        on_path: set[str] = set()
        stack = [(start, iter(sorted(edges[start])))]
        if start in done:
            continue
        path.append(start)
        on_path.add(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif child in on_path:
                return [*path[path.index(child) :], child]
            elif child not in done:
                stack.append((child, iter(sorted(edges[child]))))
                path.append(child)
                on_path.add(child)
    return None


def _prefixes(name: str) -> Iterator[str]:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        yield ".".join(parts[:end])


def test_the_cycle_finder_finds_a_cycle_through_a_package() -> None:
    graph = {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"q"}, "q": {"p.a"}}
    assert _find_cycle(graph) == ["p", "p.a", "p.b", "q", "p"]
    assert _find_cycle({"p": set(), "p.a": {"p.b"}, "p.b": set()}) is None
