"""A private S3 endpoint for tests and benchmarks: ``moto_server`` on a free loopback port.

The test fixtures over it (the pytest plugin ``tests/fixtures/moto.py``):

* ``moto_server`` (session): a :class:`MotoServer` process started once per test session with
  dummy credentials and a small minimum part size (``S3_UPLOAD_PART_MIN_SIZE``, so tests can
  upload many small parts); stopped at the end. moto keeps nothing across restarts.
* ``s3_bucket`` (function): a fresh, empty bucket on it.
* ``moto_checking_credentials`` (module): another server that checks credentials and IAM
  policies (moto accepts any key otherwise), with :meth:`MotoServer.add_user`.
* ``moto_secured`` (session): a server over HTTPS with a certificate of the run's CA
  (``tls_ca``) that also checks credentials and IAM policies: the secured setup's.
* ``moto_wrong_host`` (module): a server over HTTPS whose certificate (of the run's CA) names
  another host: a verifying client must refuse it.

If ``moto_server`` is not installed the fixture FAILS (it never skips): ``pip install -e
.[dev]`` (``moto[server]``). The benchmark ``bench/s3_multipart.py`` starts its server through
:func:`private_server` too.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from setups.servers.local import ServerMissingError, free_port, stop_process
from setups.servers.tls import CertificateAuthority, Issued

HOST = "127.0.0.1"
ACCESS_KEY_ID = "testing-access-key"
SECRET_ACCESS_KEY = "testing-secret-key"  # moto accepts any
REGION = "us-east-1"
#: The test server's minimum part size (S3's is 5 MiB): pass it as ``min_part_size=``.
MIN_PART_SIZE = 4096
#: Requests moto serves before it checks credentials: add_user's three IAM calls for the admin.
SETUP_ACTIONS = 3
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
INSTALL_HINT = "install the dev extra: pip install -e '.[dev]' (it brings moto[server])"

_buckets = itertools.count()


class MotoMissingError(ServerMissingError):
    """moto_server is not installed."""


def _binary() -> str:
    beside = Path(sys.executable).with_name("moto_server")
    path = str(beside) if beside.exists() else shutil.which("moto_server")
    if path is None:
        raise MotoMissingError(f"moto_server not found beside {sys.executable} or on PATH: "
                               f"{INSTALL_HINT}")
    return path


@dataclass
class MotoServer:
    """One moto_server process on a loopback port, and the credentials its clients use."""

    port: int
    process: subprocess.Popen[bytes]
    access_key_id: str = ACCESS_KEY_ID
    secret_access_key: str = SECRET_ACCESS_KEY
    #: The CA file of its certificate when it serves HTTPS (None: plain HTTP).
    ca_bundle: str | None = None
    #: False if its certificate names another host: the tests' own client (which reads what
    #: was written) then skips verification, as no sink ever may.
    names_host: bool = True

    @property
    def endpoint_url(self) -> str:
        return f"{'https' if self.ca_bundle else 'http'}://{HOST}:{self.port}"

    def options(self) -> dict[str, Any]:
        """What an S3Sink needs to reach it (the crash suite passes these to the driver)."""
        tls = {"ca_bundle": self.ca_bundle} if self.ca_bundle else {}
        return {"endpoint_url": self.endpoint_url, "region": REGION, "path_style": True,
                "access_key_id": self.access_key_id,
                "secret_access_key": self.secret_access_key, "min_part_size": MIN_PART_SIZE,
                **tls}

    def client(self, service: str = "s3") -> Any:
        return boto3.client(
            service, endpoint_url=self.endpoint_url, region_name=REGION,
            aws_access_key_id=self.access_key_id, aws_secret_access_key=self.secret_access_key,
            verify=self.ca_bundle if self.names_host else False,
            config=Config(s3={"addressing_style": "path"},
                          request_checksum_calculation="when_required"))

    def add_user(self, name: str, actions: list[str]) -> tuple[str, str]:
        """An IAM user allowed ``actions`` (``"s3:*"``...) on everything: its key id and secret.
        Only a server started with ``checks_credentials=True`` tells users apart."""
        return self.add_user_with_policy(name, {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": actions, "Resource": "*"}]})

    def add_user_with_policy(self, name: str, policy: dict[str, Any]) -> tuple[str, str]:
        """An IAM user holding exactly ``policy`` (an IAM policy document): its key id and
        secret."""
        iam = self.client("iam")
        iam.create_user(UserName=name)
        key = iam.create_access_key(UserName=name)["AccessKey"]
        iam.put_user_policy(UserName=name, PolicyName=f"{name}-policy",
                            PolicyDocument=json.dumps(policy))
        return key["AccessKeyId"], key["SecretAccessKey"]

    def new_bucket(self, prefix: str = "twophase") -> str:
        name = f"{prefix}-{os.getpid()}-{next(_buckets)}"
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        stop_process(self.process, STOP_TIMEOUT_S)


def _wait_ready(server: MotoServer, log: Path, *, check_hostname: bool = True) -> None:
    context = ssl.create_default_context(cafile=server.ca_bundle) if server.ca_bundle else None
    if context is not None:
        context.check_hostname = check_hostname
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"moto_server exited with {server.process.returncode}: "
                               f"{log.read_text()[-2000:]}")
        with contextlib.suppress(OSError, urllib.error.URLError):
            urllib.request.urlopen(f"{server.endpoint_url}/moto-api/", timeout=1,
                                   context=context).close()
            return
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"moto_server did not answer within {READY_TIMEOUT_S}s: {log}")


@contextlib.contextmanager
def private_server(log_dir: Path, *, checks_credentials: bool = False,
                   tls: Issued | None = None, ca: CertificateAuthority | None = None,
                   names_host: bool = True) -> Iterator[MotoServer]:
    """Start moto_server on a free port, wait until it answers, stop it on exit.

    ``checks_credentials``: the server refuses unknown keys, bad signatures and actions a
    user's IAM policy does not allow (moto's IAM check, on after the first
    ``SETUP_ACTIONS`` requests); the yielded server's credentials are an admin's, and
    :meth:`MotoServer.add_user` makes more.

    ``tls`` (a certificate of ``ca``): the server serves HTTPS only, and its clients verify
    it against ``ca``'s file; ``names_host=False`` if the certificate names another host.
    """
    binary = _binary()
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "moto_server.log"
    env = {**os.environ, "S3_UPLOAD_PART_MIN_SIZE": str(MIN_PART_SIZE),
           "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
           "AWS_DEFAULT_REGION": REGION}
    if checks_credentials:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(SETUP_ACTIONS)
    port = free_port(HOST)
    args = [binary, "-H", HOST, "-p", str(port)]
    if tls is not None:
        args += ["--ssl-cert", str(tls.certfile), "--ssl-key", str(tls.keyfile)]
    with log.open("wb") as out:
        process = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    server = MotoServer(port, process, ca_bundle=str(ca.cafile) if tls and ca else None,
                        names_host=names_host)
    try:
        _wait_ready(server, log, check_hostname=names_host)
        if checks_credentials:
            key_id, secret = server.add_user("admin", ["*"])  # the SETUP_ACTIONS requests
            server = replace(server, access_key_id=key_id, secret_access_key=secret)
        yield server
    finally:
        server.stop()
