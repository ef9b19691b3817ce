"""The access file's certificate entries: each names one SAN and its type, so that a name is
matched only against a certificate's SAN of that type."""

from __future__ import annotations

from pathlib import Path

import pytest

from poirotd.transports.security.access import (
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
    with pytest.raises(AccessFileError, match="both name the SAN"):
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
