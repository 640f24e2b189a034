"""A stand-in for a vLLM server running the hfdelta backend, for the tests of hfdelta.engines.

It answers the HTTP routes hfdelta.engines uses, as vLLM 0.32 does (status codes, bodies, the error
object {"error": {"message": ...}} of a route whose call failed, /start_weight_update refused while an
update is active), and does the hfdelta part with the real thing: a hfdelta._receiver.Receiver over a
real LOCAL, whose reload reads LOCAL's tensors into the "weights" this engine serves. What it stands in
for is only vLLM's HTTP layer and its model; scripts/lab/vllm-backend.sh runs the same client against
a real vLLM.

Every request is logged (time, method, path with its query, and for /collective_rpc the method), and
every reload records whether the engine was paused and what LOCAL held.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

import hfdelta
from hfdelta._receiver import Receiver


def read_weights(local: str) -> dict[str, bytes]:
    """Every tensor of a checkpoint directory, as its bytes (read from the safetensors layout itself, so
    that any dtype does)."""
    out: dict[str, bytes] = {}
    for f in sorted(glob.glob(os.path.join(local, "*.safetensors"))):
        with open(f, "rb") as fh:
            data = fh.read()
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        for name, t in header.items():
            if name != "__metadata__":
                a, b = t["data_offsets"]
                out[name] = data[8 + n + a:8 + n + b]
    return out


class StandIn:
    def __init__(self, local: str) -> None:
        self.local = str(local)
        self.receiver = Receiver(served=self.local)
        self.weights = read_weights(self.local)
        self.version = "default"
        self.paused = False
        self.active = False
        self.log: list[dict[str, Any]] = []
        self.reloads: list[dict[str, Any]] = []
        self.reload_failures = 0  # how many reloads raise before one succeeds
        self.dev_mode = True  # False: vLLM without VLLM_SERVER_DEV_MODE=1, which has none of these routes
        self.mu = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll: shutdown() waits for it, and every test closes two stand-ins.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def requests(self) -> list[str]:
        """The log as lines "METHOD PATH" ("POST /collective_rpc hfdelta_stage" for the RPCs), polls of
        hfdelta_state during the stage folded into one line."""
        lines: list[str] = []
        for e in self.log:
            line = f"{e['method']} {e['path']}" + (f" {e['rpc']}" if e.get("rpc") else "")
            if lines and line == lines[-1] and e.get("rpc") == "hfdelta_state":
                continue
            lines.append(line)
        return lines

    def _reload(self, local: str) -> None:
        with self.mu:
            if self.reload_failures > 0:
                self.reload_failures -= 1
                raise RuntimeError("stand-in reload failure")
        st = hfdelta.status(local, lock_timeout=0)
        self.weights = read_weights(local)
        self.reloads.append({"paused": self.paused, "local_version": st.version, "state": st.state})

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        if not self.dev_mode:
            return 404, {"detail": "Not Found"}
        if method == "GET" and path == "/weight_info":
            return 200, {"weight_version": self.version}
        if method != "POST":
            return 404, {"detail": "Not Found"}
        if path == "/pause":
            self.paused = True
            return 200, {"status": "paused"}
        if path == "/resume":
            self.paused = False
            return 200, {"status": "resumed"}
        if path == "/init_weight_transfer_engine":
            self.receiver.init(**body["init_info"])
            return 200, {"message": "Weight transfer initialized"}
        if path == "/start_weight_update":
            if self.active:
                raise RuntimeError("start_weight_update called while a weight update is already active. "
                                   "Call finish_weight_update first.")
            self.active = True
            return 200, {"message": "Weight update started"}
        if path == "/update_weights":
            if not self.active:
                raise RuntimeError("start_weight_update must be called before update_weights.")
            info = body["update_info"]
            try:
                self.receiver.update(info["version"], self._reload, owner=info.get("owner"))
            except BaseException:
                self.active = False
                raise
            return 200, {"message": "Weights updated"}
        if path == "/finish_weight_update":
            if not self.active:
                raise RuntimeError("finish_weight_update called without a matching start_weight_update.")
            self.active = False
            if body.get("weight_version") is not None:
                self.version = body["weight_version"]
            return 200, {"message": "Weight update finished"}
        if path == "/reset_prefix_cache":
            return 200, {"success": True}
        if path == "/collective_rpc":
            name = body["method"]
            fn = {"hfdelta_stage": self.receiver.stage, "hfdelta_state": self.receiver.state,
                  "hfdelta_release": self.receiver.release}[name]
            return 200, {"results": [fn(**body.get("kwargs", {}))]}
        return 404, {"detail": "Not Found"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _do(self, method: str) -> None:
                u = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(u.query))
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else {}
                entry: dict[str, Any] = {"t": time.monotonic(), "method": method, "path": self.path}
                if u.path == "/collective_rpc":
                    entry["rpc"] = body.get("method")
                standin.log.append(entry)
                try:
                    status, out = standin._route(method, u.path, query, body)
                except Exception as e:  # as vLLM's exception handler answers a failed call
                    status, out = 500, {"error": {"message": f"Call to {u.path.strip('/')} method failed: {e}",
                                                  "type": "InternalServerError", "code": 500}}
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._do("GET")

            def do_POST(self) -> None:
                self._do("POST")

        return Handler


def served_equals(standin: StandIn, save: Optional[str]) -> bool:
    """True if the stand-in serves exactly the tensors of the checkpoint directory ``save``."""
    return save is not None and standin.weights == read_weights(save)
