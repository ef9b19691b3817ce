"""Topic filters, name templates and the config that compiles them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from hwbridge.config import BridgeConfig, ConfigError, TopicMapping, load_config
from hwbridge.topics import Router, TopicFilter

EXAMPLE = Path(__file__).parents[2] / "hwbridge" / "bridge.example.yaml"


@pytest.mark.parametrize(
    "pattern, topic, captures",
    [
        ("d2w/+/ankle/#", "d2w/p7/ankle/left/cable", ("p7", "left/cable")),
        ("d2w/+/ankle/#", "d2w/p7/ankle", ("p7", "")),  # '#' also matches the parent level
        ("d2w/+/ankle/#", "d2w/p7/knee/left", None),
        ("d2w/+/joints", "d2w/p7/joints", ("p7",)),
        ("d2w/+/joints", "d2w/p7/joints/extra", None),
        ("d2w/+/joints", "d2w/joints", None),
        ("+/+", "a/", ("a", "")),  # an empty level is a level
        ("#", "anything/at/all", ("anything/at/all",)),
        ("#", "$SYS/broker/uptime", None),  # wildcards never reach the broker's $-topics
        ("$SYS/#", "$SYS/broker/uptime", ("broker/uptime",)),
        ("exact/topic", "exact/topic", ()),
    ],
)
def test_filters_match_like_mqtt(
    pattern: str, topic: str, captures: tuple[str, ...] | None
) -> None:
    assert TopicFilter(pattern).match(topic) == captures


@pytest.mark.parametrize("pattern", ["", "a/#/b", "a/b#", "a+/b", "#/a"])
def test_invalid_filters_are_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match="invalid MQTT topic filter"):
        TopicFilter(pattern)


def test_first_matching_mapping_wins_and_templates_name_the_signal() -> None:
    mappings = [
        TopicMapping(
            topic="d2w/+/ankle/+/cable", component="exo_{w1}", signal="ankle_{w2}_{field}"
        ),
        TopicMapping(topic="d2w/#", component="exo", signal="{w1}.{field}"),
    ]
    router = Router([m.route() for m in mappings])
    resolved = router.resolve("d2w/p7/ankle/left/cable")
    assert resolved is not None
    route, captures = resolved
    topic = "d2w/p7/ankle/left/cable"
    assert route.component.render("tension_n", topic, captures) == "exo_p7"
    assert route.signal.render("tension_n", topic, captures) == "ankle_left_tension_n"
    fallback = router.resolve("d2w/p7/vitals")
    assert fallback is not None
    assert fallback[0].signal.render("hr", "d2w/p7/vitals", fallback[1]) == "p7/vitals.hr"
    assert router.resolve("other/topic") is None


@pytest.mark.parametrize(
    "mapping, problem",
    [
        ({"topic": "d2w/+/x", "component": "exo", "signal": "{w2}"}, "allowed here"),
        ({"topic": "d2w/+/x", "component": "{patient}"}, "allowed here"),
        ({"topic": "d2w/+/x", "component": "exo", "signal": "{0}"}, "allowed here"),
        ({"topic": "d2w/+/x", "component": "exo", "signal": "{field"}, "invalid template"),
        ({"topic": "d2w/x#", "component": "exo"}, "invalid MQTT topic filter"),
        (
            {
                "topic": "a",
                "component": "c",
                "codec": {"kind": "struct", "format": "<dd", "fields": ["t"]},
            },
            "2 items",
        ),
        ({"topic": "a", "component": "c", "codec": {"kind": "xml"}}, "does not match"),
    ],
)
def test_bad_mappings_are_refused_at_load(mapping: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        TopicMapping.model_validate(mapping)


def test_example_config_loads_and_errors_name_the_field(tmp_path: Path) -> None:
    config = load_config(EXAMPLE)
    assert config.mqtt is not None and len(config.mqtt.mappings) == 5
    bad = tmp_path / "bad.yaml"
    bad.write_text("session_id: s\npoirotd: {system: cortex}\nmqtt: {mappings: []}\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: mqtt\.mappings: .*at least 1"):
        load_config(bad)
    with pytest.raises(ValidationError, match="at least one input"):
        BridgeConfig.model_validate({"session_id": "s", "poirotd": {"system": "x"}})


@pytest.mark.parametrize(
    "broker, problem",
    [
        ({"username": "u", "password": "hunter2"}, r"mqtt\.broker\.password: .*not written in"),
        ({"username": "u", "password": {"file": "a", "env": "B"}}, "exactly one of file or env"),
        ({"password": {"env": "MQTT_PASSWORD"}}, "password needs a username"),
        ({"tls": {"cert_file": "client.crt"}}, "cert_file and key_file go together"),
        ({"tls": {"ciphers": "NOT-A-CIPHER"}}, "selects no cipher"),
        ({"tls": {"min_version": "1.0"}}, r"tls\.min_version"),
    ],
)
def test_broker_security_settings_are_checked_at_load(
    tmp_path: Path, broker: dict[str, object], problem: str
) -> None:
    """A password is named, never written; TLS settings that cannot work are refused early."""
    config = tmp_path / "bridge.yaml"
    mqtt = {"broker": broker, "mappings": [{"topic": "a", "component": "c"}]}
    config.write_text(yaml.safe_dump({"session_id": "s", "poirotd": {"system": "x"}, "mqtt": mqtt}))
    with pytest.raises(ConfigError, match=problem) as caught:
        load_config(config)
    assert "hunter2" not in str(caught.value)
