"""A private certificate authority for the secured servers of the test setups.

The fixture ``tls_ca`` (``tests/fixtures/tls.py``) makes one CA per test run (in its
temporary directory, files readable by the owner only) and issues server certificates from
it: MariaDB, PostgreSQL, the Kafka broker, ``moto_server`` and the HTTP receiver all present
one for ``localhost`` and ``127.0.0.1``.
A second, unrelated CA (``other_ca``) and a certificate for another host name make the
"wrong CA" and "wrong host name" cases: a client that trusts the first CA and checks host
names must refuse both. :meth:`CertificateAuthority.issue_client` issues client certificates
(mutual TLS): their common name is the user they log in as, and a server that trusts the run's
CA refuses one of ``other_ca``.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from setups.servers.local import write_owner_only

#: The names every server certificate is valid for (the servers listen on loopback).
SERVER_NAMES = ("localhost", "127.0.0.1")
#: A name no server of the setups has: a certificate for it fails host-name verification.
WRONG_HOST = "not-this-host.invalid"
VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class Issued:
    """A server's or a client's certificate (PEM, the CA's after it) and its key (PEM)."""

    certfile: Path
    keyfile: Path


class CertificateAuthority:
    """A self-signed CA in ``folder`` (``ca.pem``) that issues server certificates."""

    def __init__(self, folder: Path, name: str = "twophase test CA") -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        self._certificate = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256()))
        self.cafile = folder / "ca.pem"
        write_owner_only(self.cafile, self._certificate.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, hosts: tuple[str, ...] = SERVER_NAMES) -> Issued:
        """A certificate for ``hosts`` (DNS names or IP addresses): ``<name>.pem``, ``.key``."""
        return self._issue(name, hosts[0], ExtendedKeyUsageOID.SERVER_AUTH,
                           x509.SubjectAlternativeName([_general_name(h) for h in hosts]))

    def issue_client(self, user: str, name: str | None = None) -> Issued:
        """A client certificate whose common name is ``user`` (what PostgreSQL's
        ``clientcert=verify-full`` and MariaDB's ``REQUIRE SUBJECT`` compare with the user):
        ``<name>.pem`` and ``.key`` (``name`` defaults to ``client-<user>``)."""
        return self._issue(name or f"client-{user}", user, ExtendedKeyUsageOID.CLIENT_AUTH)

    def _issue(self, name: str, common_name: str, usage: x509.ObjectIdentifier,
               *extensions: x509.ExtensionType) -> Issued:
        """A certificate for ``common_name`` signed by this CA (the CA's certificate after it
        in ``<name>.pem``) and its key (``<name>.key``), both readable by the owner only."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
        for extension in extensions:
            builder = builder.add_extension(extension, critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        issued = Issued(self.folder / f"{name}.pem", self.folder / f"{name}.key")
        write_owner_only(issued.certfile, certificate.public_bytes(serialization.Encoding.PEM)
               + self._certificate.public_bytes(serialization.Encoding.PEM))
        write_owner_only(issued.keyfile, key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        return issued


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)
