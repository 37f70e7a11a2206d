"""Real ``etcd`` and ``nats-server`` processes for the distributed tests, on free loopback
ports, with their data in a temporary directory. ``stop()``/``start()`` keep the same ports
and data, so fault tests can take a service away and bring it back."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(
    port: int, proc: subprocess.Popen, what: str, timeout: float = 15.0, host: str = "127.0.0.1"
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout}s")


def _need(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise RuntimeError(
            f"{binary} is not installed: scripts/test.sh installs it "
            "(apt-get install -y etcd-server etcd-client nats-server)"
        )
    return path


class Service:
    """A server process that can be stopped and restarted on the same port."""

    name = "service"

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.dir = Path(tempfile.mkdtemp(prefix=f"dyn-{self.name}-"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        # Closed in close().
        self.log = open(self.dir / "log.txt", "ab")

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command(), stdout=self.log, stderr=subprocess.STDOUT)
        _wait_port(self.port, self.proc, self.name, host=self.host)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def close(self) -> None:
        self.stop()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Etcd(Service):
    """A single-member etcd cluster on 127.0.0.1."""

    name = "etcd"

    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__(host)
        self.peer_port = free_port()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        """Start, then wait for ``/health``: etcd accepts connections before it serves
        requests, and a lease grant sent at once can be reset on a loaded machine."""
        import json
        import urllib.request

        super().start()
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"etcd on port {self.port} never reported healthy")

    def command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            _need("etcd"),
            "--name",
            "dyn-test",
            "--data-dir",
            str(self.dir / "data"),
            "--listen-client-urls",
            self.endpoint,
            "--advertise-client-urls",
            self.endpoint,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"dyn-test={peer}",
            "--log-level",
            "error",
        ]

    def etcdctl(self, *args: str) -> str:
        out = subprocess.run(
            [_need("etcdctl"), "--endpoints", self.endpoint, *args],
            capture_output=True,
            text=True,
            timeout=10,
            env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
            check=True,
        )
        return out.stdout


class Nats(Service):
    """A nats-server on 127.0.0.1 (core NATS, no JetStream), optionally requiring a user
    and password or a token; ``auth_env`` holds the matching ``NATS_AUTH_*`` variables."""

    name = "nats"

    def __init__(
        self,
        max_payload: int | None = None,
        host: str = "127.0.0.1",
        *,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
    ) -> None:
        super().__init__(host)
        self.max_payload = max_payload
        self.user, self.password, self.token = user, password, token

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def auth_env(self) -> dict[str, str]:
        if self.user is not None:
            return {"NATS_AUTH_USERNAME": self.user, "NATS_AUTH_PASSWORD": self.password or ""}
        if self.token is not None:
            return {"NATS_AUTH_TOKEN": self.token}
        return {}

    def command(self) -> list[str]:
        cmd = [_need("nats-server"), "-a", self.host, "-p", str(self.port)]
        conf = []
        if self.max_payload is not None:
            conf.append(f"max_payload: {self.max_payload}")
        if self.user is not None:
            user, password = json.dumps(self.user), json.dumps(self.password or "")
            conf.append(f"authorization {{ user: {user}, password: {password} }}")
        elif self.token is not None:
            conf.append(f"authorization {{ token: {json.dumps(self.token)} }}")
        if conf:
            path = self.dir / "nats.conf"
            path.write_text("\n".join(conf) + "\n")
            cmd += ["-c", str(path)]
        return cmd
