"""Helpers shared by the SDK compatibility scripts: the simulator's control surface (/sim) and
small assertions. The scripts change nothing in the SDKs but the base URL and the key.

Environment:
  TRANCHE_SIM_URL  the simulator's root, e.g. http://127.0.0.1:8080
  TRANCHE_SIM_KEY  the API key the simulator expects
"""

import json
import os
import sys
import urllib.request

BASE = os.environ["TRANCHE_SIM_URL"].rstrip("/")
KEY = os.environ["TRANCHE_SIM_KEY"]


def _call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{BASE}{path}", data=data, method=method)
    req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as res:
        text = res.read().decode()
        is_json = res.headers.get("content-type", "").startswith("application/json")
    return json.loads(text) if is_json else text


def advance(seconds):
    """Moves the simulator's virtual clock forward (no wall-clock waiting)."""
    return _call("POST", "/sim/clock/advance", {"seconds": seconds})


def now():
    return _call("GET", "/sim/clock")["now"]


def stats():
    return _call("GET", "/sim/stats")


def ledger():
    text = _call("GET", "/sim/ledger")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def update_config(change):
    """Reads the config, lets `change` edit it, writes it back (keeping the key, which the
    simulator never sends back)."""
    config = _call("GET", "/sim/config")
    change(config)
    config["api_key"] = KEY
    return _call("POST", "/sim/config", config)


def check(cond, message):
    if not cond:
        print(f"FAILED: {message}", file=sys.stderr)
        sys.exit(1)


def expect_error(exc_type, fn, *args, **kwargs):
    """Calls fn, which must raise exc_type; returns the exception."""
    try:
        fn(*args, **kwargs)
    except exc_type as e:
        return e
    except Exception as e:  # noqa: BLE001 - report what came instead
        check(False, f"expected {exc_type.__name__}, got {type(e).__name__}: {e}")
    check(False, f"expected {exc_type.__name__}, but the call succeeded")


# A system prompt long enough to be cached (well over 1,024 tokens).
POLICY = "You label support tickets. " + "Parcels ship within two days; refunds take a week. " * 120


def chat_lines(n, model, prefix, url="/v1/chat/completions"):
    """A JSONL batch input of n chat requests sharing a long system prompt (one asks for a JSON
    schema answer)."""
    out = []
    for i in range(n):
        body = {
            "model": model,
            "messages": [
                {"role": "system", "content": POLICY},
                {"role": "user", "content": f"Ticket {i}: my order never arrived"},
            ],
        }
        if i == 0:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": "label",
                    "strict": True,
                    "schema": {
                        "type": "object",
                        "properties": {"label": {"type": "string", "enum": ["shipping", "billing"]}},
                        "required": ["label"],
                        "additionalProperties": False,
                    },
                },
            }
        out.append(json.dumps({"custom_id": f"{prefix}-{i}", "method": "POST", "url": url, "body": body}))
    return ("\n".join(out) + "\n").encode()
