"""Load the YAML system spec and say exactly where each problem in it is.

Pydantic tells which field is wrong; an operator editing a long spec also needs the line. The text
is composed once into a YAML node tree (which keeps line marks) and the data is constructed from
that same tree, so what is validated is what ``yaml.safe_load`` returns and every error location
pydantic reports can be walked back through the nodes to a line of the file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from poirotd.config.spec import SystemSpec

Loc = tuple[int | str, ...]

# A spec is a few thousand values at most, a few levels deep. Aliases let a few lines of YAML
# stand for billions of values (a "billion laughs"), each of which would be built and validated,
# and nesting past Python's recursion limit breaks the parser: both are refused up front.
MAX_VALUES = 100_000
MAX_DEPTH = 64

if TYPE_CHECKING:
    _SafeLoader = yaml.SafeLoader
else:
    # libyaml's parser where PyYAML has it (its wheels do): the pure-Python one spends seconds
    # on a few thousand nested brackets before it fails; libyaml refuses them at once. Same
    # safe constructor, hence the same data.
    _SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_SafeLoader):
    """PyYAML's safe loader, but a value its explicit tag does not fit (`!!timestamp hello`,
    `!!bool maybe`) is a YAML error with its line: PyYAML's scalar constructors trust the tag
    and fail with whatever Python raises (AttributeError, KeyError, ValueError)."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ArithmeticError, AttributeError, KeyError, TypeError, ValueError) as exc:
            kind = str(node.tag).rsplit(":", 1)[-1]
            text = str(node.value)
            shown = repr(text if len(text) <= 40 else f"{text[:40]}…")
            problem = f"{shown} is not a valid {kind}"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from exc


@dataclass(frozen=True)
class SpecProblem:
    """One thing wrong with a spec: which field (dotted path), where (1-based line), and what."""

    # "" when the problem concerns the document as a whole (syntax, empty file, top-level rules).
    path: str
    # The line of the field or of its nearest existing parent; None when no line is known.
    line: int | None
    message: str

    def render(self, source: str) -> str:
        """``FILE:LINE: path: message``, the form editors and CI logs turn into links."""
        where = source if self.line is None else f"{source}:{self.line}"
        return ": ".join(part for part in (where, self.path, self.message) if part)


class SpecError(ValueError):
    """The spec cannot be used; ``problems`` lists every reason found, in file order."""

    def __init__(self, source: str, problems: list[SpecProblem]) -> None:
        super().__init__(source, problems)
        self.source = source
        self.problems = problems

    def __str__(self) -> str:
        return "\n".join(problem.render(self.source) for problem in self.problems)


# A further check of a validated spec (a transport's own section): raises a ValidationError
# whose locations start at the document's root, so its problems get their lines too.
SpecCheck = Callable[[SystemSpec], object]


def load_spec(path: Path, checks: Sequence[SpecCheck] = ()) -> SystemSpec:
    """Read, parse and validate a system spec file; raise SpecError listing every problem."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise SpecError(str(path), [SpecProblem("", None, f"cannot read: {reason}")]) from exc
    return _load(raw, str(path), checks)


def load_spec_text(
    text: str, source: str = "<string>", checks: Sequence[SpecCheck] = ()
) -> SystemSpec:
    """As load_spec, for spec text already in memory; ``source`` names it in error messages."""
    return _load(text, source, checks)


def _load(stream: str | bytes, source: str, checks: Sequence[SpecCheck]) -> SystemSpec:
    try:
        # Bytes go to PyYAML undecoded so that it detects UTF-8/UTF-16 the way safe_load does.
        loader = _Loader(stream)
        try:
            root = loader.get_single_node()
            if root is None:
                raise SpecError(source, [SpecProblem("", None, "the spec is empty")])
            if (too_large := _too_large(root)) is not None:
                raise SpecError(source, [too_large])
            # Before construction: resolving merge keys (<<) rewrites mapping nodes in place.
            problems = _duplicate_keys(root)
            data = loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        raise SpecError(source, [_syntax_problem(exc)]) from exc
    except yaml.YAMLError as exc:  # undecodable bytes or forbidden characters: no line mark
        raise SpecError(source, [SpecProblem("", None, " ".join(str(exc).split()))]) from exc
    except RecursionError as exc:  # the parser recurses per level, past MAX_DEPTH by far
        message = f"the spec is nested more than {MAX_DEPTH} levels deep"
        raise SpecError(source, [SpecProblem("", None, message)]) from exc

    if data is None:
        raise SpecError(source, [SpecProblem("", _line(root), "the spec is empty")])
    if not isinstance(data, dict):
        got = "a sequence" if isinstance(data, list) else "a single value"
        message = f"the spec must be a mapping of top-level fields, got {got}"
        raise SpecError(source, [SpecProblem("", _line(root), message)])
    try:
        spec = SystemSpec.model_validate(data)
        for check in checks:
            check(spec)
    except ValidationError as exc:
        for error in exc.errors(include_url=False, include_input=False, include_context=False):
            path, line = _locate(root, error["loc"])
            problems.append(SpecProblem(path, line, error["msg"]))
    else:
        if not problems:
            return spec
    problems.sort(key=lambda p: p.line or 0)
    raise SpecError(source, problems)


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _syntax_problem(exc: yaml.MarkedYAMLError) -> SpecProblem:
    """PyYAML's own message repeats the stream name and marks; keep only what and where."""
    message = exc.problem or exc.context or type(exc).__name__
    if exc.problem and exc.context:
        started = f" at line {exc.context_mark.line + 1}" if exc.context_mark else ""
        message = f"{exc.problem} ({exc.context}{started})"
    mark = exc.problem_mark or exc.context_mark
    return SpecProblem("", None if mark is None else mark.line + 1, message)


def _too_large(root: yaml.Node) -> SpecProblem | None:
    """Nesting past MAX_DEPTH, an alias inside the value it names (a cycle), or more than
    MAX_VALUES values once aliases are expanded. One walk of the node tree, each shared node
    sized once, so a billion laughs costs its lines, not its expansion."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    # (node, depth, children pushed yet); a node is sized once its children are.
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, expanded = stack.pop()
        children = _children(node)
        if expanded:
            on_path.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
            if sizes[id(node)] > MAX_VALUES:
                message = (
                    f"the spec stands for more than {MAX_VALUES:,} values once its aliases "
                    "are expanded"
                )
                return SpecProblem("", _line(node), message)
            continue
        if id(node) in sizes:
            continue
        if depth > MAX_DEPTH:
            return SpecProblem(
                "", _line(node), f"the spec is nested more than {MAX_DEPTH} levels deep"
            )
        on_path.add(id(node))
        stack.append((node, depth, True))
        for child in children:
            if id(child) in on_path:
                return SpecProblem("", _line(child), "an alias refers to a value that contains it")
            stack.append((child, depth + 1, False))
    return None


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _duplicate_keys(root: yaml.Node) -> list[SpecProblem]:
    """safe_load keeps the last of two equal keys without a word, silently losing config."""
    problems: list[SpecProblem] = []
    seen: set[int] = set()  # anchors and aliases share nodes, and may even form cycles
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                name = str(key.value) if isinstance(key, yaml.ScalarNode) else "?"
                child = f"{path}.{name}" if path else name
                ident = (key.tag, name)
                if isinstance(key, yaml.ScalarNode) and ident in first:
                    message = f"duplicate key (first at line {first[ident]})"
                    problems.append(SpecProblem(child, _line(key), message))
                first.setdefault(ident, _line(key))
                stack.append((value, child))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
    return problems


def _locate(root: yaml.Node, loc: Loc) -> tuple[str, int]:
    """Walk pydantic's error location down the node tree.

    Returns the dotted path as written in the file and the line of the deepest node on it that
    exists (a missing field has no line of its own, so its parent's is the useful one).
    """
    node: yaml.Node | None = root
    line = _line(root)
    path = ""
    for i, part in enumerate(loc):
        if isinstance(node, yaml.MappingNode):
            key, value = _find_key(node, part)
            # Pydantic only descends through keys present in the input, so an absent name that is
            # not the last part is a union tag it inserted (llm.embedded.threads), not a field.
            if key is None and isinstance(part, str) and i < len(loc) - 1:
                continue
            if key is not None:
                line = _line(key)
            node = value
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            node = node.value[part] if 0 <= part < len(node.value) else None
            if node is not None:
                line = _line(node)
        else:
            node = None
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path, line


def _find_key(node: yaml.MappingNode, part: int | str) -> tuple[yaml.Node | None, yaml.Node | None]:
    """The last matching key wins, as in the constructed dict (after merge keys are resolved)."""
    found: tuple[yaml.Node | None, yaml.Node | None] = (None, None)
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode) and key.value == str(part):
            found = (key, value)
    return found
