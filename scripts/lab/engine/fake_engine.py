#!/usr/bin/env python3
"""A stand-in for the HTTP endpoints contrib/reload-*.sh call, for tests.

Serves the vLLM 0.32 dev-mode endpoints the vLLM script uses (/pause,
/collective_rpc, /reset_prefix_cache, /update_weight_version, /resume,
/weight_info), its runtime LoRA endpoints (VLLM_ALLOW_RUNTIME_LORA_UPDATING:
/v1/load_lora_adapter, /v1/unload_lora_adapter, and /v1/models listing the
adapters loaded) and SGLang's /update_weights_from_disk and /model_info. It
checks each request the way the engines' handlers would (query parameters,
JSON body fields and types, an absolute model path that is a directory),
answers 422 when a request is wrong, keeps the engine state (paused,
weight_version), and appends every request but its own controls to a
JSON-lines log.

Test controls, on the command line:
  --fail PATH=STATUS     answer PATH with STATUS (repeatable)
  --delay PATH=SECONDS   sleep before answering PATH (repeatable)
  --reset-false N        /reset_prefix_cache answers {"success": false} N times
and over HTTP: GET /_state (paused, weight_version, counts), POST /_restart
(weight_version back to "default" and no adapters, as after an engine restart),
POST /_fail?path=PATH&status=STATUS (as --fail, from now on; status 0 ends it).
/_state's "adapters" maps each loaded adapter name to its path and the
SHA-256 of the adapter_model.safetensors it held when loaded.

Usage: fake_engine.py --port-file FILE --log FILE [options]
It listens on 127.0.0.1, on a free port it writes to --port-file.
"""
import argparse
import hashlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

lock = threading.Lock()
state = {"paused": False, "weight_version": "default", "reset_false_left": 0,
         "reloads": 0, "model_path": None, "adapters": {}, "lora_loads": 0}


def parse_pairs(items, conv):
    out = {}
    for item in items:
        k, _, v = item.partition("=")
        out[k] = conv(v)
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def reply(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def handle_any(self, method):
        u = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(u.query).items()}
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        body, body_error = None, None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError as e:
                body_error = str(e)
        entry = {"t": time.time(), "method": method, "path": u.path, "query": query,
                 "content_type": self.headers.get("Content-Type"),
                 "body": body if body_error is None else raw.decode("utf-8", "replace")}
        if not u.path.startswith("/_"):  # the test's own controls stay out of the log
            with lock:
                with open(self.server.args.log, "a") as f:
                    f.write(json.dumps(entry) + "\n")
        delay = self.server.delays.get(u.path)
        if delay:
            time.sleep(delay)
        if u.path in self.server.fails:
            return self.reply(self.server.fails[u.path], {"error": "injected failure"})
        if body_error is not None:
            return self.reply(400, {"detail": f"JSON decode error: {body_error}"})
        if raw and "application/json" not in (self.headers.get("Content-Type") or ""):
            return self.reply(415, {"detail": "Content-Type must be application/json"})
        route = getattr(self, "r_" + method + u.path.replace("/", "_"), None)
        if route is None:
            return self.reply(404, {"detail": "Not Found"})
        return route(query, body)

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    # --- checks -------------------------------------------------------------
    def bad(self, msg):
        return self.reply(422, {"detail": msg})

    def model_dir_ok(self, path):
        return (isinstance(path, str) and os.path.isabs(path) and os.path.isdir(path)
                and os.path.exists(os.path.join(path, "config.json"))
                or isinstance(path, str) and os.path.isabs(path) and os.path.isdir(path)
                and any(f.endswith(".safetensors") for f in os.listdir(path)))

    # --- vLLM 0.32 dev mode -----------------------------------------------------
    def r_POST_pause(self, q, body):
        if q.get("mode", "abort") not in ("abort", "wait", "keep"):
            return self.bad(f"invalid mode {q.get('mode')!r}")
        with lock:
            state["paused"] = True
        return self.reply(200, {"status": "paused"})

    def r_POST_resume(self, q, body):
        with lock:
            state["paused"] = False
        return self.reply(200, {"status": "resumed"})

    def r_POST_collective_rpc(self, q, body):
        if not isinstance(body, dict):
            return self.reply(400, {"detail": "Request body must be a JSON object"})
        if body.get("method") != "reload_weights":
            return self.bad(f"unexpected method {body.get('method')!r}")
        kwargs = body.get("kwargs", {})
        if not isinstance(kwargs, dict) or not all(isinstance(v, str) for v in kwargs.values()):
            return self.bad("kwargs must be an object of strings")
        if set(kwargs) - {"weights_path"}:
            return self.bad(f"unexpected kwargs {sorted(kwargs)}")
        path = kwargs.get("weights_path")
        if path is not None and not self.model_dir_ok(path):
            return self.bad(f"weights_path {path!r} is not an absolute checkpoint directory")
        with lock:
            if not state["paused"]:
                return self.bad("reload_weights while the engine is not paused")
            state["reloads"] += 1
            state["model_path"] = path
        return self.reply(200, {"results": [None]})

    def r_POST_reset_prefix_cache(self, q, body):
        with lock:
            if state["reset_false_left"] > 0:
                state["reset_false_left"] -= 1
                return self.reply(200, {"success": False})
        return self.reply(200, {"success": True})

    def r_POST_update_weight_version(self, q, body):
        if not isinstance(body, dict) or not isinstance(body.get("new_version"), str):
            return self.bad("body must be {\"new_version\": string}")
        with lock:
            state["weight_version"] = body["new_version"]
        return self.reply(200, {"success": True, "new_version": body["new_version"]})

    def r_GET_weight_info(self, q, body):
        return self.reply(200, {"weight_version": state["weight_version"]})

    # --- vLLM 0.32 runtime LoRA updating ------------------------------------------
    def r_POST_v1_load_lora_adapter(self, q, body):
        if not isinstance(body, dict):
            return self.reply(400, {"detail": "Request body must be a JSON object"})
        allowed = {"lora_name", "lora_path", "load_inplace", "is_3d_lora_weight"}
        if set(body) - allowed:
            return self.bad(f"unknown fields {sorted(set(body) - allowed)}")
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
            return self.reply(400, {"error": {"message": "Both 'lora_name' and 'lora_path' must be provided.",
                                              "type": "InvalidUserInput", "code": 400}})
        if name == "tiny":
            return self.reply(400, {"error": {"message": f"The lora adapter '{name}' conflicts with a served "
                                              "base model.", "type": "InvalidUserInput", "code": 400}})
        with lock:
            if name in state["adapters"] and not body.get("load_inplace"):
                return self.reply(400, {"error": {"message": f"The lora adapter '{name}' has already been loaded. "
                                                  "If you want to load the adapter in place, set 'load_inplace' "
                                                  "to True.", "type": "InvalidUserInput", "code": 400}})
        st = os.path.join(path, "adapter_model.safetensors")
        if not (os.path.isabs(path) and os.path.isfile(os.path.join(path, "adapter_config.json"))
                and os.path.isfile(st)):
            return self.reply(404, {"error": {"message": f"Loading lora {name} failed: No adapter found for "
                                              f"{path}", "type": "NotFoundError", "code": 404}})
        with open(st, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        with lock:
            state["adapters"][name] = {"path": path, "sha256": digest}
            state["lora_loads"] += 1
        return self.reply(200, f"Success: LoRA adapter '{name}' added successfully.")

    def r_POST_v1_unload_lora_adapter(self, q, body):
        if not isinstance(body, dict):
            return self.reply(400, {"detail": "Request body must be a JSON object"})
        name = body.get("lora_name")
        if not isinstance(name, str) or not name:
            return self.reply(400, {"error": {"message": "'lora_name' needs to be provided to unload a LoRA "
                                              "adapter.", "type": "InvalidUserInput", "code": 400}})
        with lock:
            if name not in state["adapters"]:
                return self.reply(404, {"error": {"message": f"The lora adapter '{name}' cannot be found.",
                                                  "type": "NotFoundError", "code": 404}})
            del state["adapters"][name]
        return self.reply(200, f"Success: LoRA adapter '{name}' removed successfully.")

    def r_GET_v1_models(self, q, body):
        with lock:
            data = [{"id": "tiny", "object": "model", "root": "/base", "parent": None}]
            data += [{"id": n, "object": "model", "root": a["path"], "parent": "tiny"}
                     for n, a in state["adapters"].items()]
        return self.reply(200, {"object": "list", "data": data})

    # --- SGLang -----------------------------------------------------------------
    def r_POST_update_weights_from_disk(self, q, body):
        if not isinstance(body, dict):
            return self.bad("body must be a JSON object")
        allowed = {"model_path", "load_format", "abort_all_requests", "weight_version",
                   "is_async", "torch_empty_cache", "keep_pause", "recapture_cuda_graph",
                   "token_step", "flush_cache", "manifest"}
        if set(body) - allowed:
            return self.bad(f"unknown fields {sorted(set(body) - allowed)}")
        if not self.model_dir_ok(body.get("model_path")):
            return self.reply(400, {"success": False, "message":
                                    f"model_path {body.get('model_path')!r} is not an absolute "
                                    "checkpoint directory", "num_paused_requests": 0})
        wv = body.get("weight_version")
        if wv is not None and not isinstance(wv, str):
            return self.bad("weight_version must be a string")
        with lock:
            state["reloads"] += 1
            state["model_path"] = body["model_path"]
            if wv is not None:
                state["weight_version"] = wv
        return self.reply(200, {"success": True, "message": "Succeeded to update model weights.",
                                "num_paused_requests": 0})

    def r_GET_model_info(self, q, body):
        return self.reply(200, {"model_path": state["model_path"],
                                "weight_version": state["weight_version"]})

    # --- test controls ------------------------------------------------------------
    def r_GET__state(self, q, body):
        with lock:
            return self.reply(200, {k: v for k, v in state.items()})

    def r_POST__fail(self, q, body):
        path, status = q.get("path"), int(q.get("status", "0"))
        if not path:
            return self.bad("path missing")
        with lock:
            if status:
                self.server.fails[path] = status
            else:
                self.server.fails.pop(path, None)
        return self.reply(200, {"fails": self.server.fails})

    def r_POST__restart(self, q, body):
        with lock:
            state.update(paused=False, weight_version="default", adapters={})
        return self.reply(200, {"status": "restarted"})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--fail", action="append", default=[])
    ap.add_argument("--delay", action="append", default=[])
    ap.add_argument("--reset-false", type=int, default=0)
    args = ap.parse_args()
    state["reset_false_left"] = args.reset_false
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.args = args
    srv.fails = parse_pairs(args.fail, int)
    srv.delays = parse_pairs(args.delay, float)
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(tmp, args.port_file)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
