"""The spec loader names the field and line of every problem; the demo spec and session hold."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

import poirotd
from poirotd.config import Settings
from poirotd.config.loader import SpecError, SpecProblem, load_spec, load_spec_text
from poirotd.config.spec import ProtocolSpec
from poirotd.model import AgentMessage, MessageKind
from poirotd.transports.mqtt import mqtt_input_spec

DEMO = Path(poirotd.__file__).parent / "demo"

VALID = """\
# a minimal system
system:
  name: tiny
  description: Two agents and a robot.
agents:
  - id: planner
    name: Planner
    system_prompt: You plan.
  - id: executor
    name: Executor
    system_prompt: You execute.
components:
  - id: robot
    name: Robot arm
    type: hardware
    description: "Error signature: drops parts. Normal behaviour: places parts."
protocol:
  beta: 0.25
"""


def line_of(text: str, needle: str) -> int:
    """1-based line of the first line containing needle, so tests don't hard-code numbers."""
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in text")


def problems_of(text: str) -> list[SpecProblem]:
    with pytest.raises(SpecError) as caught:
        load_spec_text(text, "spec.yaml")
    return caught.value.problems


def only_problem(text: str) -> SpecProblem:
    problems = problems_of(text)
    assert len(problems) == 1, problems
    return problems[0]


def test_valid_spec_loads() -> None:
    spec = load_spec_text(VALID)
    assert spec.agent_ids == ("planner", "executor")
    assert spec.components[0].type == "hardware"


def test_missing_field_points_at_its_parent() -> None:
    text = VALID.replace("    system_prompt: You execute.\n", "")
    problem = only_problem(text)
    assert problem.path == "agents[1].system_prompt"
    assert problem.line == line_of(text, "id: executor")
    assert problem.message == "Field required"


def test_wrong_type_points_at_the_field() -> None:
    text = VALID.replace("beta: 0.25", "beta: high")
    problem = only_problem(text)
    assert problem.path == "protocol.beta"
    assert problem.line == line_of(text, "beta: high")
    assert "valid number" in problem.message


def test_bad_enum_value() -> None:
    text = VALID.replace("type: hardware", "type: robot")
    problem = only_problem(text)
    assert problem.path == "components[0].type"
    assert problem.line == line_of(text, "type: robot")
    assert "'hardware'" in problem.message


def test_duplicate_ids_point_at_the_top_level() -> None:
    text = VALID.replace("id: robot", "id: planner")
    problem = only_problem(text)
    assert problem.path == ""
    assert problem.line == line_of(text, "system:")
    assert "repeated: ['planner']" in problem.message


def test_unknown_field_is_refused() -> None:
    text = VALID.replace("    name: Planner\n", "    name: Planner\n    role: boss\n")
    problem = only_problem(text)
    assert problem.path == "agents[0].role"
    assert problem.line == line_of(text, "role: boss")
    assert problem.message == "Extra inputs are not permitted"


ROBOT = """    description: "Error signature: drops parts. Normal behaviour: places parts."
"""


def test_a_component_declares_its_signals_ranges_without_a_new_hazard_space() -> None:
    ranged = VALID.replace(ROBOT, ROBOT + "    signals:\n      grip_n: {min: -5, max: 120}\n")
    spec = load_spec_text(ranged)
    grip = spec.components[0].signals["grip_n"]
    assert (grip.min, grip.max) == (-5.0, 120.0)
    # Ranges are ingest's business: Phase I's hazard space stays the one it built.
    assert spec.description_version() == load_spec_text(VALID).description_version()


@pytest.mark.parametrize(
    ("signals", "message"),
    [
        ("{grip_n: {min: 5, max: 5}}", "min (5.0) must be less than max (5.0)"),
        ("{grip_n: {min: 0, max: 1e200}}", "1e+200 is not within ±1e+150"),
        ("{grip_n: {min: 0, max: .nan}}", "nan is not within ±1e+150"),
        ("{grip_n: {max: 5}}", "Field required"),
    ],
)
def test_a_signal_range_must_be_a_range_within_the_limit(signals: str, message: str) -> None:
    text = VALID.replace(ROBOT, ROBOT + f"    signals: {signals}\n")
    problem = only_problem(text)
    assert problem.path.startswith("components[0].signals.grip_n")
    assert message in problem.message


def test_the_default_value_range_is_a_setting_within_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().telemetry_max_abs_value == 2**53
    monkeypatch.setenv("POIROTD_TELEMETRY_MAX_ABS_VALUE", "1e12")
    assert Settings().telemetry_max_abs_value == 1e12
    with pytest.raises(ValidationError, match="not within ±1e"):
        Settings(telemetry_max_abs_value=1e151)


def test_union_tag_is_not_part_of_the_path() -> None:
    text = VALID + "llm:\n  backend: embedded\n  threads: 0\n"
    problem = only_problem(text)
    assert problem.path == "llm.threads"
    assert problem.line == line_of(text, "threads: 0")


def test_duplicate_key_would_silently_lose_config() -> None:
    text = VALID.replace("    name: Planner\n", "    name: Planner\n    name: Boss\n")
    problem = only_problem(text)
    assert problem.path == "agents[0].name"
    assert problem.line == line_of(text, "name: Boss")
    assert problem.message == f"duplicate key (first at line {line_of(text, 'name: Planner')})"


def test_yaml_syntax_error_has_its_line() -> None:
    text = VALID.replace("  name: tiny\n", "  name: tiny\n   bad: [\n")
    problem = only_problem(text)
    assert problem.path == ""
    assert problem.line == line_of(text, "bad: [")


def test_top_level_must_be_a_mapping() -> None:
    problem = only_problem("\n- system\n- agents\n")
    assert problem.line == 2
    assert "mapping" in problem.message and "sequence" in problem.message


def test_empty_document() -> None:
    assert only_problem("# nothing yet\n").message == "the spec is empty"


def test_every_problem_is_reported_one_per_line_in_file_order() -> None:
    text = VALID.replace("type: hardware", "type: robot").replace(
        "    system_prompt: You execute.\n", ""
    )
    with pytest.raises(SpecError) as caught:
        load_spec_text(text, "spec.yaml")
    assert str(caught.value).splitlines() == [
        f"spec.yaml:{line_of(text, 'id: executor')}: agents[1].system_prompt: Field required",
        f"spec.yaml:{line_of(text, 'type: robot')}: components[0].type: "
        "Input should be 'agent', 'hardware', 'software', 'physical', 'human' or 'other'",
    ]


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    with pytest.raises(SpecError) as caught:
        load_spec(missing)
    assert str(caught.value) == f"{missing}: cannot read: No such file or directory"

    bad = tmp_path / "bad.yaml"
    bad.write_text(VALID.replace("beta: 0.25", "beta: -1"))
    with pytest.raises(SpecError) as caught:
        load_spec(bad)
    assert str(caught.value).startswith(f"{bad}:{line_of(bad.read_text(), 'beta: -1')}: ")

    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"system: \xff\n")
    with pytest.raises(SpecError) as caught:
        load_spec(binary)
    assert caught.value.problems[0].line is None
    assert "\n" not in str(caught.value)


# ------------------------------------------------------------------ the demo


def test_demo_spec_loads_with_condensed_prompts() -> None:
    spec = load_spec(DEMO / "cortex.yaml")
    assert spec.system.name == "cortex"
    assert spec.agent_ids == ("doctor", "chief", "physio_general")
    component_ids = [c.id for c in spec.components]
    assert component_ids == ["d2w_exoskeleton", "patient", "parent", "comm_channels"]
    assert spec.hazard_space is None  # Phase I builds it
    for agent in spec.agents:
        assert len(agent.system_prompt) <= 1600, agent.id
    for component in spec.components:
        assert component.description.startswith("Error signature: ")
        assert "Normal behaviour: " in component.description


def test_demo_session_fits_the_embedded_model() -> None:
    spec = load_spec(DEMO / "cortex.yaml")
    lines = (DEMO / "cortex_session.jsonl").read_text(encoding="utf-8").splitlines()
    now = datetime.now(UTC)
    messages = [AgentMessage(session_id="demo", sent_at=now, **json.loads(line)) for line in lines]

    assert [m.index for m in messages] == list(range(len(messages)))
    parties = {*spec.agent_ids, *(c.id for c in spec.components), "system"}
    for m in messages:
        assert m.sender in parties or m.sender.startswith("tool:"), m.index
        assert m.recipient in parties or m.recipient.startswith("tool:") or m.recipient == ""
        if m.kind is MessageKind.AGENT:
            assert m.sender in spec.agent_ids, m.index
        if m.kind is MessageKind.TOOL:
            assert m.sender == f"tool:{m.tool_name}" and m.recipient in spec.agent_ids, m.index

    # Budget: every agent's prompt (system prompt + its view + protocol, ~2.5k tokens) must leave
    # room in the 8k context for 8 consultation turns.
    assert 12 <= len(messages) <= 20
    assert sum(len(m.content) for m in messages) <= 6500


def test_a_spec_from_before_sub_regions_still_loads() -> None:
    """`protocol.max_extra_regions` bounded what Phase I added; it now bounds sub-regions."""
    protocol = ProtocolSpec.model_validate({"max_extra_regions": 5})
    assert protocol.max_sub_regions == 5
    with pytest.raises(ValidationError):
        ProtocolSpec.model_validate({"max_extra_regions": 65})


# ------------------------------------------------------------------ YAML's own hazards (issue 20)

INPUTS = """\
inputs:
  session_id: s1
  mqtt:
    broker: {host: 127.0.0.1}
    mappings: [{topic: lab/x, component: robot}]
    junk:
"""


def alias_bomb(width: int, depth: int) -> str:
    """Lines under `junk` that stand for width**depth values once their aliases expand."""
    lines = [f"      l0: &l0 [{', '.join(['x'] * width)}]"]
    for level in range(1, depth):
        lines.append(f"      l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def daemon_problem(text: str) -> SpecProblem:
    """The only problem the daemon's loader (with the MQTT input's check) finds."""
    with pytest.raises(SpecError) as caught:
        load_spec_text(text, "spec.yaml", checks=[mqtt_input_spec])
    assert len(caught.value.problems) == 1, caught.value.problems
    return caught.value.problems[0]


def test_an_alias_bomb_is_refused_before_it_expands() -> None:
    """A million values from six lines, in a section that takes any value: built and copied
    whole before, now refused at the first line that passes the bound."""
    text = VALID + INPUTS + alias_bomb(10, 6)
    problem = daemon_problem(text)
    assert (
        problem.message
        == "the spec stands for more than 100,000 values once its aliases are expanded"
    )
    assert problem.line == line_of(text, "l4: &l4")  # 111,111 values already
    # Aliases within the bound are fine.
    shared = VALID.replace("You plan.", "&prompt You plan.").replace("You execute.", "*prompt")
    assert load_spec_text(shared).agents[1].system_prompt == "You plan."


@pytest.mark.parametrize("depth", [100, 5_000])
def test_deep_nesting_is_a_spec_error(depth: int) -> None:
    """5,000 nested brackets raised RecursionError out of the loader (issue 20's fuzzer)."""
    problem = daemon_problem(VALID + "deep: " + "[" * depth + "]" * depth + "\n")
    assert "nest" in problem.message


def test_an_alias_inside_the_value_it_names_is_a_spec_error() -> None:
    text = VALID + INPUTS.replace("    junk:\n", "    junk: &a [*a]\n")
    problem = daemon_problem(text)
    assert problem.message == "an alias refers to a value that contains it"
    assert problem.line == line_of(text, "junk: &a")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("!!timestamp hello", "'hello' is not a valid timestamp"),
        ("!!timestamp 2001-13-45", "'2001-13-45' is not a valid timestamp"),
        ("!!bool maybe", "'maybe' is not a valid bool"),
        ("!!int 0x", "'0x' is not a valid int"),
    ],
)
def test_a_value_its_tag_does_not_fit_is_a_spec_error_with_its_line(
    value: str, message: str
) -> None:
    """PyYAML's constructors raised AttributeError, KeyError or ValueError out of the loader
    (issue 20's fuzzer: `!!timestamp` on a value that is not one)."""
    text = VALID.replace("  beta: 0.25\n", f"  beta: {value}\n")
    problem = only_problem(text)
    assert problem.message == message
    assert problem.line == line_of(text, value)
