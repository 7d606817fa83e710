"""Throwaway PKI for a test control plane: one CA, serving certificates, the service-account keys.

Everything lives in the control plane's temporary directory and dies with it. EC P-256 keys keep
generation instant; kube-apiserver accepts ECDSA for serving and for service-account signing
(`--service-account-signing-key-file` takes RSA or ECDSA keys).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from pd_operator.controller.certs import alt_name, subject

VALIDITY = timedelta(days=2)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass(frozen=True)
class Pair:
    cert: pathlib.Path
    key: pathlib.Path


class CA:
    """A CA whose certificate clients trust (kubeconfigs, `--root-ca-file`)."""

    def __init__(self, directory: pathlib.Path, name: str = "pd-operator-test-ca") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.now(UTC)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._cert = (x509.CertificateBuilder().subject_name(subject(name)).issuer_name(subject(name))
                      .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                      .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + VALIDITY)
                      .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                      .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                   content_commitment=False, key_encipherment=False,
                                                   data_encipherment=False, key_agreement=False,
                                                   encipher_only=False, decipher_only=False), critical=True)
                      .sign(self._key, hashes.SHA256()))
        self.pem = self._cert.public_bytes(serialization.Encoding.PEM)
        self.cert = directory / "ca.crt"
        self.cert.write_bytes(self.pem)

    def serving(self, name: str, hosts: list[str]) -> Pair:
        """A server certificate for `hosts` (IPs or DNS names), written as NAME.crt / NAME.key."""
        return self._issue(name, hosts[0], ExtendedKeyUsageOID.SERVER_AUTH,
                           x509.SubjectAlternativeName([alt_name(h) for h in hosts]))

    def client(self, name: str, common_name: str) -> Pair:
        """A client certificate whose subject is `common_name` (the user it authenticates as)."""
        return self._issue(name, common_name, ExtendedKeyUsageOID.CLIENT_AUTH)

    def _issue(self, name: str, common_name: str, usage: x509.ObjectIdentifier,
               alt_names: x509.SubjectAlternativeName | None = None) -> Pair:
        now = datetime.now(UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(subject(common_name))
                   .issuer_name(self._cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + VALIDITY)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if alt_names is not None:
            builder = builder.add_extension(alt_names, critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = Pair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(_key_pem(key))
        pair.key.chmod(0o600)
        return pair


def service_account_keys(directory: pathlib.Path) -> Pair:
    """The key pair kube-apiserver verifies and signs service-account tokens with (sa.pub, sa.key);
    the controller-manager signs the legacy token Secrets with the same private key."""
    key = ec.generate_private_key(ec.SECP256R1())
    pair = Pair(directory / "sa.pub", directory / "sa.key")
    pair.cert.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                        serialization.PublicFormat.SubjectPublicKeyInfo))
    pair.key.write_bytes(_key_pem(key))
    pair.key.chmod(0o600)
    return pair
