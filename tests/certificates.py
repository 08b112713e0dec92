"""A throwaway certificate authority for tests that serve TLS on this machine: a CA not in the
host's bundle and a server certificate it signed for one name or address, written as PEM files.
A client trusting only the CA proves it checked the certificate against what it asked for."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Certs:
    ca: Path
    cert: Path
    key: Path


def issue(tmp: Path, subject: str, *, ca_name: str = "agentq test CA") -> Certs:
    """A CA named ``ca_name`` and a certificate it signed for ``subject`` only: an IP address
    (its SAN an IPAddress) or a DNS name (a DNSName), valid from five minutes ago for a day."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    ca = (
        x509.CertificateBuilder().subject_name(issuer).issuer_name(issuer).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    try:
        san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(subject))
    except ValueError:
        san = x509.DNSName(subject)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([san]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    out = Certs(tmp / "ca.pem", tmp / "server.pem", tmp / "server.key")
    out.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return out
