"""The official `openai` SDK against tranche sim's OpenAI surface: every file and batch operation,
parsed with strict response validation. Only base_url and the key differ from real use."""

import json

import openai
from openai import OpenAI
from openai.types.chat import ChatCompletion

from simctl import BASE, KEY, advance, chat_lines, check, expect_error, ledger, stats, update_config

client = OpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0, _strict_response_validation=True)

# Upload with an expiry (the SDK sends expires_after[anchor] / expires_after[seconds]).
data = chat_lines(4, "gpt-4o-mini", "req")
f = client.files.create(
    file=("input.jsonl", data),
    purpose="batch",
    expires_after={"anchor": "created_at", "seconds": 3600},
)
check(f.object == "file" and f.purpose == "batch" and f.bytes == len(data), f"upload: {f}")
check(f.expires_at == f.created_at + 3600, f"expiry: {f}")
check(client.files.retrieve(f.id).id == f.id, "retrieve file")
check(client.files.content(f.id).read() == data, "input content")

# Raw bytes, as some clients upload them: the SDK names the file `upload`, which the API takes;
# a name with another extension is refused.
raw = client.files.create(file=data, purpose="batch")
check(raw.filename == "upload" and raw.bytes == len(data), f"raw upload: {raw}")
refused = expect_error(
    openai.BadRequestError, client.files.create, file=("input.csv", data), purpose="batch"
)
check("Must be .jsonl" in str(refused), f"refusal: {refused}")
client.files.delete(raw.id)

# More uploads, then list across pages (limit 2, newest first, after= cursors).
more = [client.files.create(file=(f"more{i}.jsonl", b"{}\n"), purpose="batch").id for i in range(3)]
listed = [x.id for x in client.files.list(purpose="batch", limit=2)]
check(listed == list(reversed([f.id] + more)), f"files across pages: {listed}")
asc = [x.id for x in client.files.list(purpose="batch", order="asc", limit=3)]
check(asc == [f.id] + more, f"files ascending: {asc}")

# Create with metadata and an output expiry; watch it run on the virtual clock.
b = client.batches.create(
    input_file_id=f.id,
    endpoint="/v1/chat/completions",
    completion_window="24h",
    metadata={"job": "sdk"},
    output_expires_after={"anchor": "created_at", "seconds": 7200},
)
check(b.status == "validating" and b.metadata == {"job": "sdk"}, f"create: {b}")
advance(2)
check(client.batches.retrieve(b.id).status == "in_progress", "in_progress")
advance(60)
b = client.batches.retrieve(b.id)
check(b.status == "completed", f"completed: {b}")
check(b.request_counts.total == 4 and b.request_counts.completed == 4, f"counts: {b.request_counts}")
check(b.usage is not None and b.usage.input_tokens > 0, f"usage: {b.usage}")
cached = b.usage.input_tokens_details.cached_tokens
check(cached >= 3 * 1024 and cached % 128 == 0, f"a repeated system prompt is cached: {b.usage}")
out = client.files.retrieve(b.output_file_id)
check(out.purpose == "batch_output" and out.expires_at == out.created_at + 7200, f"output file: {out}")
lines = [json.loads(x) for x in client.files.content(b.output_file_id).text.splitlines()]
ids = [x["custom_id"] for x in lines]
check(sorted(ids) == [f"req-{i}" for i in range(4)] and ids != [f"req-{i}" for i in range(4)], f"order: {ids}")
entries = {x["custom_id"]: x for x in ledger() if x["batch_id"] == b.id}
for line in lines:
    check(line["id"].startswith("batch_req_") and line["error"] is None, f"line: {line}")
    completion = ChatCompletion.model_validate(line["response"]["body"], strict=False)
    check(completion.choices[0].message.content, "answer text")
    usage, entry = completion.usage, entries[line["custom_id"]]
    check(usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens, f"never all cached: {usage}")
    check(usage.completion_tokens_details.reasoning_tokens == 0, f"reasoning: {usage}")
    expected = {
        "model": completion.model,
        "input_tokens": usage.prompt_tokens,
        "cached_tokens": usage.prompt_tokens_details.cached_tokens,
        "cache_write_5m_tokens": 0,
        "cache_write_1h_tokens": 0,
        "output_tokens": usage.completion_tokens,
        "reasoning_tokens": 0,
    }
    check({k: entry[k] for k in expected} == expected, f"ledger entry {entry} for {usage}")
schema_line = next(x for x in lines if x["custom_id"] == "req-0")
label = json.loads(schema_line["response"]["body"]["choices"][0]["message"]["content"])["label"]
check(label in ("shipping", "billing"), f"schema answer: {label}")

# A batch whose file fails validation.
bad = client.files.create(file=("bad.jsonl", b"{not json\n"), purpose="batch")
fb = client.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h")
advance(5)
fb = client.batches.retrieve(fb.id)
check(fb.status == "failed" and fb.errors.data[0].code == "invalid_json_line", f"failed: {fb}")
check(fb.errors.data[0].line == 1, f"line number: {fb.errors}")

# A per-line failure lands in the error file.
mixed = chat_lines(2, "gpt-4o-mini", "mix") + json.dumps(
    {"custom_id": "mix-bad", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "gpt-4o-mini"}}
).encode() + b"\n"
mf = client.files.create(file=("mixed.jsonl", mixed), purpose="batch")
mb = client.batches.create(input_file_id=mf.id, endpoint="/v1/chat/completions", completion_window="24h")
advance(60)
mb = client.batches.retrieve(mb.id)
check(mb.request_counts.failed == 1 and mb.error_file_id, f"mixed: {mb}")
err = [json.loads(x) for x in client.files.content(mb.error_file_id).text.splitlines()]
check(err[0]["custom_id"] == "mix-bad" and err[0]["response"]["status_code"] == 400, f"error line: {err}")

# Cancel: cancelling, then cancelled with the unrun lines in the error file.
update_config(lambda c: c["processing"].update({"requests_per_second": 0.01}))
cf = client.files.create(file=("cancel.jsonl", chat_lines(3, "gpt-4o-mini", "can")), purpose="batch")
cb = client.batches.create(input_file_id=cf.id, endpoint="/v1/chat/completions", completion_window="24h")
advance(3)
cb = client.batches.cancel(cb.id)
check(cb.status == "cancelling" and cb.cancelling_at is not None, f"cancelling: {cb}")
advance(60)
cb = client.batches.retrieve(cb.id)
check(cb.status == "cancelled", f"cancelled: {cb}")
cancelled = [json.loads(x) for x in client.files.content(cb.error_file_id).text.splitlines()]
check(all(x["error"]["code"] == "batch_cancelled" for x in cancelled), f"cancelled lines: {cancelled}")
update_config(lambda c: c["processing"].update({"requests_per_second": 1000}))

# List batches across pages.
all_batches = [x.id for x in client.batches.list(limit=2)]
check(all_batches == [cb.id, mb.id, fb.id, b.id], f"batches across pages: {all_batches}")

# Delete, then 404s the SDK maps to NotFoundError.
deleted = client.files.delete(f.id)
check(deleted.deleted and deleted.id == f.id, f"delete: {deleted}")
e = expect_error(openai.NotFoundError, client.files.retrieve, f.id)
check(e.status_code == 404 and e.body["message"].startswith("No such File"), f"404 body: {e.body}")
expect_error(openai.NotFoundError, client.batches.retrieve, "batch_nope")

# Error bodies the SDK parses: bad request, wrong key, injected 429 with Retry-After, dropped connection.
e = expect_error(
    openai.BadRequestError,
    client.batches.create,
    input_file_id=more[0],
    endpoint="/v1/chat/completions",
    completion_window="48h",
)
check(e.param == "completion_window" and e.code == "invalid_value", f"400: {e.body}")
wrong = OpenAI(base_url=f"{BASE}/v1", api_key="sk-wrong", max_retries=0)
e = expect_error(openai.AuthenticationError, wrong.files.list)
check(e.code == "invalid_api_key", f"401: {e.body}")
update_config(lambda c: c.update({"faults": [
    {"provider": "openai", "operation": "create", "status": 429, "code": "rate_limit_exceeded", "retry_after": 1},
    {"provider": "openai", "operation": "list", "status": 0},
]}))
e = expect_error(
    openai.RateLimitError,
    client.batches.create,
    input_file_id=more[0],
    endpoint="/v1/chat/completions",
    completion_window="24h",
)
check(e.code == "rate_limit_exceeded" and e.response.headers.get("retry-after") == "1", f"429: {e.body}")
expect_error(openai.APIConnectionError, client.files.list)
update_config(lambda c: c.update({"faults": []}))

s = stats()
check(s["by_provider"]["openai"]["batches_created"] == 4, f"stats: {s}")
check(s["requests_billed"] == sum(1 for x in ledger() if x["outcome"] == "succeeded"), "ledger matches stats")
print("openai SDK", openai.__version__, "ok")
