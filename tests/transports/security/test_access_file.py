"""The access file's certificate entries: each names one SAN and its type, so that a name is
matched only against a certificate's SAN of that type; and its errors, which name an entry by its
position, never by its key or a value."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from poirotd.transports.security.access import (
    AccessControl,
    AccessDeniedError,
    AccessFileError,
    AccessPolicy,
    CertificateName,
    ClientCertificate,
    DenialReason,
    certificate_entry,
    load_access_file,
)

CONTROL_ID = "spiffe://poirotd.local/control"


@pytest.mark.parametrize(
    ("entry", "name"),
    [
        (CONTROL_ID, CertificateName("uri", CONTROL_ID)),  # the files written before types
        (f"uri:{CONTROL_ID}", CertificateName("uri", CONTROL_ID)),
        (
            "uri:urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66",
            CertificateName("uri", "urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66"),
        ),
        ("control.clinic.example", CertificateName("dns", "control.clinic.example")),
        ("dns:Control.Clinic.Example.", CertificateName("dns", "control.clinic.example")),
        ("dns:*.mas.svc", CertificateName("dns", "*.mas.svc")),
    ],
)
def test_an_entry_names_a_typed_san(entry: str, name: CertificateName) -> None:
    assert certificate_entry(entry) == name


@pytest.mark.parametrize(
    "entry",
    ["control software", "ops@clinic.example", "127.0.0.1", "dns:spiffe://x/y", "uri:no-scheme"],
)
def test_an_entry_that_names_no_uri_or_dns_san_is_refused_at_load(
    tmp_path: Path, entry: str
) -> None:
    path = tmp_path / "access.yaml"
    path.write_text(f'certificates:\n  "{entry}": {{name: x, roles: [reader]}}\n')
    with pytest.raises(AccessFileError, match="certificates"):
        load_access_file(path)


def test_two_spellings_of_one_san_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "access.yaml"
    path.write_text(
        f"certificates:\n  {CONTROL_ID}: {{name: a, roles: [reader]}}\n"
        f"  uri:{CONTROL_ID}: {{name: b, roles: [operator]}}\n"
    )
    with pytest.raises(AccessFileError, match="entries 1 and 2 of certificates both name"):
        load_access_file(path)


def test_a_name_matches_only_an_entry_of_its_type(tmp_path: Path) -> None:
    path = tmp_path / "access.yaml"
    path.write_text(
        f"certificates:\n  {CONTROL_ID}: {{name: control, roles: [operator]}}\n"
        "  dns:laptop.example: {name: laptop, roles: [reader]}\n"
    )
    policy = AccessPolicy(load_access_file(path))
    assert policy.identify(None, ClientCertificate.of([CONTROL_ID], [])).name == "control"
    assert policy.identify(None, ClientCertificate.of([], ["LAPTOP.example"])).name == "laptop"
    for wrong in (
        ClientCertificate.of([], [CONTROL_ID]),
        ClientCertificate.of(["laptop.example"], []),
    ):
        with pytest.raises(AccessDeniedError) as denied:
            policy.identify(None, wrong)
        assert denied.value.reason is DenialReason.UNKNOWN_CERTIFICATE
    # A certificate with no URI or DNS SAN at all is a certificate, not missing credentials.
    with pytest.raises(AccessDeniedError) as denied:
        policy.identify(None, ClientCertificate(()))
    assert denied.value.reason is DenialReason.UNKNOWN_CERTIFICATE


SECRET = "sk-live-7Qz1mV0cXb2NnR8t"  # what an operator might paste where a hash belongs


@pytest.mark.parametrize(
    ("document", "where"),
    [
        (  # the token itself as a key, not its hash
            f"tokens:\n  {'a' * 64}: {{name: a, roles: [reader]}}\n"
            f"  {'b' * 64}: {{name: b, roles: [reader]}}\n"
            f"  {SECRET}: {{name: c, roles: [reader]}}\n",
            "entry 3 of tokens, its key: String should match pattern",
        ),
        (  # a token as a certificate name
            f"certificates:\n  dns:a.example: {{name: a, roles: [reader]}}\n"
            f"  'key:{SECRET}': {{name: b, roles: [reader]}}\n",
            "entry 2 of certificates: its key is neither a URI",
        ),
        (  # a good key whose grant is wrong
            f"tokens:\n  {SECRET}0000: {{name: a, roles: [root]}}\n",
            "entry 1 of tokens, roles, item 1: Input should be",
        ),
        (f"{SECRET}: {{name: a, roles: [reader]}}\n", "key 1 of the file: Extra inputs"),
        (
            f"tokens:\n  {'a' * 64}: {{name: a, {SECRET}: x}}\n",
            "entry 1 of tokens, key 2: Extra inputs",
        ),
        (f"tokens: {{{SECRET}: [}}\n", "is not YAML or JSON at line 1, column"),
    ],
)
def test_an_error_names_the_entry_by_position_never_its_key(
    tmp_path: Path, document: str, where: str
) -> None:
    """The message goes to the ERROR log at a reload: a secret pasted as a key must not."""
    path = tmp_path / "access.yaml"
    path.write_text("tokens: {}\n")
    control = AccessControl(path)
    path.write_text(document)
    with pytest.raises(AccessFileError) as caught:
        load_access_file(path)
    text = "".join(str(e) for e in (caught.value, caught.value.__cause__, caught.value.__context__))
    assert where in text
    assert SECRET not in text
    with structlog.testing.capture_logs() as logs:
        control._checked_at = 0.0  # the stat is looked at again now
        control.policy()
    assert [line["log_level"] for line in logs] == ["error"]
    assert SECRET not in repr(logs)
