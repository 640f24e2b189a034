#!/usr/bin/env python3
"""Query an OpenAI-compatible engine with fixed prompts, and compare answers.

  check_outputs.py wait URL SECONDS
      wait until GET URL/health answers 200
  check_outputs.py query URL MODEL OUT.json
      send PROMPTS one request at a time (greedy, temperature 0, 16 tokens,
      top-5 logprobs, token ids rather than strings) and save the answers;
      the long prompt is sent twice in a row, so the second one is served
      from the prefix cache
  check_outputs.py post URL PATH [JSON]
      one POST (for the test's own reload sequences); fails unless 2xx
  check_outputs.py compare GOT.json WANT.json [--tol 1e-4] [--expect same|different]
      same (default): the greedy tokens of every request are identical and
      every logprob (sampled and top-5) is within --tol; exit 1 otherwise.
      different: at least one request's tokens differ; exit 1 otherwise.
      Prints one JSON line: tokens_equal, max_logprob_diff, differing requests,
      and the prompt tokens each request of either side took from the prefix cache.

Only the standard library: it runs with any python3.
"""
import argparse
import json
import sys
import time
import urllib.error
import urllib.request

# The long one is well over three KV-cache blocks of 32 tokens with the
# tokenizer tiny_model.py trains, so its blocks are cached and reused.
LONG = ("The trainer saves a checkpoint after every step, and the delta tool sends "
        "only the weights that changed to every host that runs an inference engine. "
        "Each host patches its local copy in place, checks every checksum, and then "
        "asks the engine to reload the weights from disk while the copy is still "
        "locked, so that no request ever sees a mix of old and new weights. The "
        "engine must also forget the keys and values it cached for earlier prompts.")
PROMPTS = [
    "The engine reloads the weights",
    LONG,
    LONG,
    "Every host checks the checksum of the local copy before",
    "A small model with random weights says",
]

MAX_TOKENS = 16
TOP_LOGPROBS = 5


def post(url, obj, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(obj).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def cmd_wait(a):
    deadline = time.time() + a.seconds
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(a.url.rstrip("/") + "/health", timeout=5) as r:
                if r.status == 200:
                    return 0
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.5)
    print(f"{a.url}: not ready after {a.seconds} s", file=sys.stderr)
    return 1


def cmd_query(a):
    url = a.url.rstrip("/") + "/v1/completions"
    results = []
    for i, prompt in enumerate(PROMPTS):
        r = post(url, {"model": a.model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                       "temperature": 0, "logprobs": TOP_LOGPROBS, "ignore_eos": True,
                       "return_tokens_as_token_ids": True, "seed": 0})
        c = r["choices"][0]
        lp = c["logprobs"]
        details = r["usage"].get("prompt_tokens_details") or {}
        results.append({"request": i, "prompt_tokens": r["usage"]["prompt_tokens"],
                        "cached_tokens": details.get("cached_tokens"),
                        "tokens": lp["tokens"], "token_logprobs": lp["token_logprobs"],
                        "top_logprobs": lp["top_logprobs"], "text": c["text"]})
    with open(a.out, "w") as f:
        json.dump({"url": a.url, "results": results}, f, indent=1)
    return 0


def cmd_post(a):
    req = urllib.request.Request(a.url.rstrip("/") + a.path, method="POST",
                                 data=a.json.encode() if a.json else None,
                                 headers={"Content-Type": "application/json"} if a.json else {})
    try:
        with urllib.request.urlopen(req, timeout=a.timeout) as r:
            print(r.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as e:
        print(f"POST {a.path}: HTTP {e.code}: {e.read()[:500]!r}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"POST {a.path}: {e}", file=sys.stderr)
        return 1
    return 0


def compare(got, want):
    max_diff = 0.0
    differing = []
    shape_errors = []
    for g, w in zip(got["results"], want["results"]):
        if g["tokens"] != w["tokens"]:
            differing.append(g["request"])
            continue
        for x, y in zip(g["token_logprobs"], w["token_logprobs"]):
            max_diff = max(max_diff, abs(x - y))
        for tg, tw in zip(g["top_logprobs"], w["top_logprobs"]):
            if set(tg) != set(tw):
                shape_errors.append(g["request"])
                continue
            for k in tg:
                max_diff = max(max_diff, abs(tg[k] - tw[k]))
    if len(got["results"]) != len(want["results"]):
        shape_errors.append("count")
    return max_diff, differing, sorted(set(map(str, shape_errors)))


def cmd_compare(a):
    with open(a.got) as f:
        got = json.load(f)
    with open(a.want) as f:
        want = json.load(f)
    max_diff, differing, top_set_differs = compare(got, want)
    tokens_equal = not differing
    out = {"tokens_equal": tokens_equal, "max_logprob_diff": max_diff,
           "differing_requests": differing, "top5_sets_differ": top_set_differs,
           "cached_tokens": [r.get("cached_tokens") for r in got["results"]],
           "want_cached_tokens": [r.get("cached_tokens") for r in want["results"]]}
    print(json.dumps(out))
    if a.expect == "same":
        return 0 if tokens_equal and not top_set_differs and max_diff <= a.tol else 1
    return 0 if not tokens_equal else 1


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wait")
    w.add_argument("url")
    w.add_argument("seconds", type=float)
    q = sub.add_parser("query")
    q.add_argument("url")
    q.add_argument("model")
    q.add_argument("out")
    p = sub.add_parser("post")
    p.add_argument("url")
    p.add_argument("path")
    p.add_argument("json", nargs="?")
    p.add_argument("--timeout", type=float, default=300)
    c = sub.add_parser("compare")
    c.add_argument("got")
    c.add_argument("want")
    c.add_argument("--tol", type=float, default=1e-4)
    c.add_argument("--expect", choices=["same", "different"], default="same")
    a = ap.parse_args()
    return {"wait": cmd_wait, "query": cmd_query, "post": cmd_post,
            "compare": cmd_compare}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
