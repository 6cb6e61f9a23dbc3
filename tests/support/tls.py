"""Throwaway certificate authorities for the TLS tests, made at test time (`cryptography`).

`make_pki(directory)` writes, as PEM files:

- `ca`: a CA certificate the bridge is told to trust;
- `server_cert` / `server_key`: a server certificate that CA signed, for the host name
  `localhost` only (subjectAltName DNS:localhost, no IP address), so a client that connects to
  `localhost` and checks the host name accepts it, and one that connects to `127.0.0.1` is
  refused for a host name mismatch;
- `other_ca`: an unrelated CA that signed nothing the servers present: trusting it instead of
  `ca` is the "wrong CA" case.

Keys are ECDSA P-256 (fast to make; PostgreSQL, Erlang/OTP and rustls all take them); the
certificates are valid from a minute ago for a day.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["SERVER_HOST", "Pki", "make_pki"]

#: The one host name the server certificate is for.
SERVER_HOST = "localhost"


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    other_ca: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: str, issuer: str, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )


def _authority(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        _builder(common_name, common_name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _server(
    host: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    issuer = ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        _builder(host, str(issuer), key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def make_pki(directory: Path) -> Pki:
    """A CA, a server certificate it signed for `localhost`, and an unrelated CA, in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _authority("bridge test CA")
    server, server_key = _server(SERVER_HOST, ca, ca_key)
    other, _ = _authority("bridge test CA (unrelated)")
    key_path = directory / "server.key"
    key_path.touch(mode=0o600)
    key_path.write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Pki(
        ca=_write_cert(directory / "ca.pem", ca),
        server_cert=_write_cert(directory / "server.pem", server),
        server_key=key_path,
        other_ca=_write_cert(directory / "other-ca.pem", other),
    )
