"""S3 API servers on loopback for the LoRA tests.

* ``Moto``: a real S3 API implementation (``python -m moto.server``) with IAM
  authentication on, so signatures and access keys are checked as AWS does.
* ``FakeS3``: a minimal ListObjectsV2 + GetObject server whose transfers the test
  controls (slow bodies, connections cut mid-body, a server that dies), and which counts
  the requests it serves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse
from xml.sax.saxutils import escape

from services import free_port

REGION = "us-east-1"

# Requests moto serves before it starts checking credentials: exactly the three IAM calls
# that create the test user, its policy and its access key.
_BOOTSTRAP_ACTIONS = 3


class Moto:
    """``moto.server`` on a free loopback port, with one IAM user allowed ``s3:*``."""

    def __init__(self) -> None:
        import boto3

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT=str(_BOOTSTRAP_ACTIONS))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.url + "/moto-api/", timeout=1).read()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto.server did not start") from None
                time.sleep(0.1)
        iam = boto3.client(
            "iam",
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        iam.create_user(UserName="lora")
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
        }
        iam.put_user_policy(UserName="lora", PolicyName="s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="lora")["AccessKey"]
        self.key_id: str = key["AccessKeyId"]
        self.secret: str = key["SecretAccessKey"]
        self.s3 = boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=self.key_id,
            aws_secret_access_key=self.secret,
        )

    def env(self) -> dict[str, str]:
        """The AWS environment a worker would have."""
        return {
            "AWS_ACCESS_KEY_ID": self.key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.url,
        }

    def upload_adapter(self, bucket: str, prefix: str, weights: bytes, extra: bool = True):
        """An adapter under ``s3://bucket/prefix``; returns ``{relative path: bytes}``."""
        files = {
            "adapter_config.json": json.dumps({"r": 8, "peft_type": "LORA"}).encode(),
            "adapter_model.safetensors": weights,
        }
        if extra:
            files["tokenizer/README.md"] = b"nested files keep their layout\n"
        for rel, body in files.items():
            self.s3.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=body)
        return files

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


class FakeS3:
    """Serves ``objects`` (``{key: bytes}``) of one bucket over the S3 REST API subset
    object_store uses (path-style ListObjectsV2 and GetObject), unsigned.

    ``chunk_delay`` slows each 64 KiB body chunk; ``cut_after`` (bytes) makes every GET of
    a body larger than that send the full ``Content-Length`` but only that many bytes
    and then close the connection; ``die_after_cut`` also stops the whole server after
    the first cut (a server that dies mid-download); ``lie_size`` makes the listing
    report a bigger size than the objects have.
    """

    def __init__(
        self,
        bucket: str,
        objects: dict[str, bytes],
        *,
        chunk_delay: float = 0.0,
        cut_after: int | None = None,
        die_after_cut: bool = False,
        lie_size: int = 0,
    ) -> None:
        self.bucket = bucket
        self.objects = objects
        self.gets: dict[str, int] = {}
        self.lists = 0
        self.cut = threading.Event()
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                path = url.path.lstrip("/")
                query = parse_qs(url.query)
                if path == fake.bucket and query.get("list-type") == ["2"]:
                    fake._list(self, query.get("prefix", [""])[0])
                elif path.startswith(fake.bucket + "/"):
                    fake._get(self, path[len(fake.bucket) + 1 :])
                else:
                    self.send_error(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._chunk_delay = chunk_delay
        self._cut_after = cut_after
        self._die_after_cut = die_after_cut
        self._lie_size = lie_size
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": "fake",
            "AWS_SECRET_ACCESS_KEY": "fake",
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.url,
        }

    def _list(self, h: BaseHTTPRequestHandler, prefix: str) -> None:
        with self._lock:
            self.lists += 1
        items = "".join(
            f"<Contents><Key>{escape(k)}</Key>"
            "<LastModified>2024-01-01T00:00:00.000Z</LastModified>"
            f'<ETag>"e{len(v)}"</ETag><Size>{len(v) + self._lie_size}</Size>'
            "<StorageClass>STANDARD</StorageClass></Contents>"
            for k, v in sorted(self.objects.items())
            if k.startswith(prefix)
        )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>{self.bucket}</Name><Prefix>{escape(prefix)}</Prefix>"
            f"<MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>{items}"
            "</ListBucketResult>"
        ).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/xml")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _get(self, h: BaseHTTPRequestHandler, key: str) -> None:
        data = self.objects.get(key)
        if data is None:
            h.send_error(404)
            return
        with self._lock:
            self.gets[key] = self.gets.get(key, 0) + 1
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.send_header("ETag", f'"e{len(data)}"')
        h.send_header("Last-Modified", formatdate(0, usegmt=True))
        h.end_headers()
        limit = len(data)
        if self._cut_after is not None and len(data) > self._cut_after:
            limit = self._cut_after
        sent = 0
        while sent < limit:
            n = min(65536, limit - sent)
            h.wfile.write(data[sent : sent + n])
            h.wfile.flush()
            sent += n
            if self._chunk_delay:
                time.sleep(self._chunk_delay)
        if limit < len(data):
            h.close_connection = True
            h.connection.shutdown(2)
            self.cut.set()
            if self._die_after_cut:
                threading.Thread(target=self.close, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
