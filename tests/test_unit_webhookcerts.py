"""The pod webhook's self-managed certificates (webhookcerts): names, validity, renewal
decisions and CA rotation."""

from __future__ import annotations

import datetime

from cryptography import x509

from topolvm.controller.webhookcerts import (
    CertBundle,
    new_bundle,
    new_serving_cert,
    renew,
    renewal_needed,
    service_dns_names,
)

NOW = datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC)
DNS = service_dns_names("topolvm-controller", "topolvm-system")
DAY = datetime.timedelta(days=1)


def test_names_and_validity_of_a_new_bundle() -> None:
    assert DNS == [
        "topolvm-controller", "topolvm-controller.topolvm-system",
        "topolvm-controller.topolvm-system.svc",
        "topolvm-controller.topolvm-system.svc.cluster.local",
    ]  # fmt: skip
    b = new_bundle(DNS, ["127.0.0.1"], NOW)
    cert = x509.load_pem_x509_certificate(b.tls_crt)
    ca = x509.load_pem_x509_certificate(b.ca_crt)
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == DNS
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.not_valid_after_utc == NOW + 365 * DAY
    assert ca.not_valid_after_utc == NOW + 3650 * DAY
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert CertBundle.from_secret({"data": b.secret_data()}) == b
    assert set(b.secret_data()) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
    assert CertBundle.from_secret({"data": {"tls.crt": "eA=="}}) is None


def test_renewal_decisions() -> None:
    b = new_bundle(DNS, [], NOW)
    assert renewal_needed(b, DNS, [], NOW)[0] == "none"
    assert renewal_needed(b, DNS, [], NOW + 240 * DAY)[0] == "none"  # more than 1/3 left
    what, why = renewal_needed(b, DNS, [], NOW + 250 * DAY)
    assert what == "serving" and "expires" in why
    assert renewal_needed(b, DNS, [], NOW + 7 * 365 * DAY)[0] == "ca"
    assert renewal_needed(None, DNS, [], NOW)[0] == "ca"
    assert renewal_needed(b, [*DNS, "extra.example"], [], NOW)[0] == "serving"
    assert renewal_needed(b, DNS, ["10.0.0.1"], NOW)[0] == "serving"
    other = new_bundle(DNS, [], NOW)
    mixed = [
        CertBundle(other.tls_crt, other.tls_key, b.ca_crt, b.ca_key),  # another CA signed it
        CertBundle(b.tls_crt, other.tls_key, b.ca_crt, b.ca_key),  # key of another cert
    ]
    assert [renewal_needed(m, DNS, [], NOW)[0] for m in mixed] == ["serving", "serving"]
    assert renewal_needed(CertBundle(b"x", b"y", b"z", b"w"), DNS, [], NOW)[0] == "ca"
    assert (
        renewal_needed(CertBundle(b.tls_crt, b.tls_key, b.ca_crt, other.ca_key), DNS, [], NOW)[0]
        == "ca"
    )


def test_renewal_keeps_the_ca_or_rotates_it_keeping_the_old_one_in_the_bundle() -> None:
    b = new_bundle(DNS, [], NOW)
    later = NOW + 250 * DAY
    serving = renew(b, "serving", DNS, [], later)
    assert (serving.ca_crt, serving.ca_key) == (b.ca_crt, b.ca_key)
    assert serving.tls_crt != b.tls_crt
    assert renewal_needed(serving, DNS, [], later)[0] == "none"
    much_later = NOW + 7 * 365 * DAY
    rotated = renew(b, "ca", DNS, [], much_later)
    cas = x509.load_pem_x509_certificates(rotated.ca_crt)
    assert len(cas) == 2 and cas[1] == x509.load_pem_x509_certificate(b.ca_crt)
    x509.load_pem_x509_certificate(rotated.tls_crt).verify_directly_issued_by(cas[0])
    assert renewal_needed(rotated, DNS, [], much_later)[0] == "none"
    # An old CA that has expired is dropped from the bundle.
    again = renew(rotated, "ca", DNS, [], NOW + 11 * 365 * DAY)
    assert len(x509.load_pem_x509_certificates(again.ca_crt)) == 2  # rotated's CA, not b's
    crt, _ = new_serving_cert(b.ca_crt, b.ca_key, ["a"], [], NOW)
    assert x509.load_pem_x509_certificate(crt).subject.rfc4514_string() == "CN=a"
