"""A private S3 endpoint for tests and benchmarks: ``moto_server`` on a free loopback port.

Used as a pytest plugin (``pytest_plugins = ["setups.servers.moto"]``) it provides:

* ``moto_server`` (session): a :class:`MotoServer` process started once per test session with
  dummy credentials and a small minimum part size (``S3_UPLOAD_PART_MIN_SIZE``, so tests can
  upload many small parts); stopped at the end. moto keeps nothing across restarts.
* ``s3_bucket`` (function): a fresh, empty bucket on it.
* ``moto_checking_credentials`` (module): another server that checks credentials and IAM
  policies (moto accepts any key otherwise), with :meth:`MotoServer.add_user`.

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
import pytest
from botocore.config import Config

from setups.servers.local import free_port, stop_process

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


class MotoMissingError(RuntimeError):
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

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def options(self) -> dict[str, Any]:
        """What an S3Sink needs to reach it (the crash suite passes these to the driver)."""
        return {"endpoint_url": self.endpoint_url, "region": REGION, "path_style": True,
                "access_key_id": self.access_key_id,
                "secret_access_key": self.secret_access_key, "min_part_size": MIN_PART_SIZE}

    def client(self, service: str = "s3") -> Any:
        return boto3.client(
            service, endpoint_url=self.endpoint_url, region_name=REGION,
            aws_access_key_id=self.access_key_id, aws_secret_access_key=self.secret_access_key,
            config=Config(s3={"addressing_style": "path"},
                          request_checksum_calculation="when_required"))

    def add_user(self, name: str, actions: list[str]) -> tuple[str, str]:
        """An IAM user allowed ``actions`` (``"s3:*"``...) on everything: its key id and secret.
        Only a server started with ``checks_credentials=True`` tells users apart."""
        iam = self.client("iam")
        iam.create_user(UserName=name)
        key = iam.create_access_key(UserName=name)["AccessKey"]
        iam.put_user_policy(UserName=name, PolicyName=f"{name}-policy",
                            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
                                {"Effect": "Allow", "Action": actions, "Resource": "*"}]}))
        return key["AccessKeyId"], key["SecretAccessKey"]

    def new_bucket(self, prefix: str = "twophase") -> str:
        name = f"{prefix}-{os.getpid()}-{next(_buckets)}"
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        stop_process(self.process, STOP_TIMEOUT_S)


def _wait_ready(server: MotoServer, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"moto_server exited with {server.process.returncode}: "
                               f"{log.read_text()[-2000:]}")
        with contextlib.suppress(OSError, urllib.error.URLError):
            urllib.request.urlopen(f"{server.endpoint_url}/moto-api/", timeout=1).close()
            return
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"moto_server did not answer within {READY_TIMEOUT_S}s: {log}")


@contextlib.contextmanager
def private_server(log_dir: Path, *, checks_credentials: bool = False) -> Iterator[MotoServer]:
    """Start moto_server on a free port, wait until it answers, stop it on exit.

    ``checks_credentials``: the server refuses unknown keys, bad signatures and actions a
    user's IAM policy does not allow (moto's IAM check, on after the first
    ``SETUP_ACTIONS`` requests); the yielded server's credentials are an admin's, and
    :meth:`MotoServer.add_user` makes more.
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
    with log.open("wb") as out:
        process = subprocess.Popen([binary, "-H", HOST, "-p", str(port)], env=env,
                                   stdout=out, stderr=subprocess.STDOUT)
    server = MotoServer(port, process)
    try:
        _wait_ready(server, log)
        if checks_credentials:
            key_id, secret = server.add_user("admin", ["*"])  # the SETUP_ACTIONS requests
            server = replace(server, access_key_id=key_id, secret_access_key=secret)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with private_server(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture
def s3_bucket(moto_server: MotoServer) -> str:
    return moto_server.new_bucket()


@pytest.fixture(scope="module")
def moto_checking_credentials(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """A second moto_server that refuses wrong credentials and unpermitted actions."""
    with private_server(tmp_path_factory.mktemp("moto-iam"), checks_credentials=True) as server:
        yield server
