"""`specserve certs --out DIR`: a local CA and the certificates TLSConfig.from_dir expects, for tests,
docs and small deployments. Production deployments bring certificates from their own CA."""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from specserve.security import ORCHESTRATOR_NAME, WORKER_NAME

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")


def make_certs(out: str | Path, hosts: Sequence[str] = (), days: int = 365) -> Path:
    """Write ca.pem (+ ca-key.pem), worker.pem / worker-key.pem (the workers' server certificate, named
    specserve-worker) and orchestrator.pem / orchestrator-key.pem (the orchestrator's: its public server
    certificate and its client certificate towards the workers, named specserve-orchestrator). Both leaf
    certificates also carry `hosts` and localhost. Keys are written readable by the owner only."""
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    all_hosts = list(dict.fromkeys([*DEFAULT_HOSTS, *hosts]))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "specserve local CA")])
    now = datetime.datetime.now(datetime.UTC)
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), now, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    _write(directory / "ca.pem", ca.public_bytes(serialization.Encoding.PEM))
    _write_key(directory / "ca-key.pem", ca_key)
    for stem, name in (("worker", WORKER_NAME), ("orchestrator", ORCHESTRATOR_NAME)):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            _builder(subject, ca_name, key.public_key(), now, days)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name), *map(_san, all_hosts)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)  # fmt: skip
            .sign(ca_key, hashes.SHA256())
        )
        _write(directory / f"{stem}.pem", cert.public_bytes(serialization.Encoding.PEM))
        _write_key(directory / f"{stem}-key.pem", key)
    return directory


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, now: datetime.datetime, days: int
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate clocks a little behind
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
