"""The official `anthropic` SDK against tranche sim's Message Batches surface: create, retrieve,
list across pages, cancel, results (fetched from the absolute results_url), delete, and the error
bodies, parsed with strict response validation. Only base_url and the key differ from real use."""

import json

import anthropic
from anthropic.types.messages import MessageBatchIndividualResponse

from simctl import BASE, KEY, advance, check, expect_error, ledger, update_config

client = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, _strict_response_validation=True)
MODEL = "claude-sonnet-4-5"
# A system prompt over Sonnet's 1,024-token minimum, marked as a cache breakpoint.
SYSTEM = [
    {
        "type": "text",
        "text": "You label support tickets into shipping, billing or other. " * 120,
        "cache_control": {"type": "ephemeral"},
    }
]


def request(custom_id, text, **extra):
    params = {"model": MODEL, "max_tokens": 256, "system": SYSTEM, "messages": [{"role": "user", "content": text}]}
    params.update(extra)
    return {"custom_id": custom_id, "params": params}


requests = [request(f"ticket-{i}", f"Ticket {i}: where is my parcel?") for i in range(4)]
requests.append(request("bad-params", "x", max_tokens=0))
requests.append(
    request(
        "structured",
        "label this",
        output_format={
            "type": "json_schema",
            "schema": {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]},
        },
    )
)
batch = client.messages.batches.create(requests=requests)
check(batch.type == "message_batch" and batch.id.startswith("msgbatch_"), f"create: {batch}")
check(batch.processing_status == "in_progress", f"status: {batch}")
check(batch.request_counts.processing == 6 and batch.results_url is None, f"counts: {batch}")
advance(3)
b = client.messages.batches.retrieve(batch.id)
check(b.processing_status == "in_progress" and b.request_counts.processing == 6, f"still processing: {b}")
advance(60)
b = client.messages.batches.retrieve(batch.id)
check(b.processing_status == "ended" and b.ended_at is not None, f"ended: {b}")
check(b.request_counts.succeeded == 5 and b.request_counts.errored == 1, f"counts: {b.request_counts}")
check(b.results_url == f"{BASE}/v1/messages/batches/{b.id}/results", f"results_url: {b.results_url}")

results = list(client.messages.batches.results(batch.id))
check(len(results) == 6, f"results: {results}")
check([r.custom_id for r in results] != [r["custom_id"] for r in requests], "order differs from input")
by_id = {}
for r in results:
    MessageBatchIndividualResponse.model_validate(r.model_dump(mode="json"))
    by_id[r.custom_id] = r.result
for i in range(4):
    result = by_id[f"ticket-{i}"]
    check(result.type == "succeeded" and result.message.content[0].type == "text", f"succeeded: {result}")
usages = [by_id[f"ticket-{i}"].message.usage for i in range(4)]
writes = [u for u in usages if u.cache_creation_input_tokens]
reads = [u for u in usages if u.cache_read_input_tokens]
check(len(writes) == 1 and len(reads) == 3, f"one write, then reads: {usages}")
for u in writes:
    check(u.cache_creation.ephemeral_5m_input_tokens == u.cache_creation_input_tokens > 1024, f"write: {u}")
    check(u.cache_creation.ephemeral_1h_input_tokens == 0 and not u.cache_read_input_tokens, f"write: {u}")
entries = {x["custom_id"]: x for x in ledger() if x["batch_id"] == batch.id}
for i, u in enumerate(usages):
    entry = entries[f"ticket-{i}"]
    total = u.input_tokens + (u.cache_creation_input_tokens or 0) + (u.cache_read_input_tokens or 0)
    expected = {
        "model": MODEL,
        "input_tokens": total,
        "cached_tokens": u.cache_read_input_tokens or 0,
        "cache_write_5m_tokens": u.cache_creation.ephemeral_5m_input_tokens,
        "cache_write_1h_tokens": u.cache_creation.ephemeral_1h_input_tokens,
        "output_tokens": u.output_tokens,
        "reasoning_tokens": 0,
    }
    check({k: entry[k] for k in expected} == expected, f"ledger entry {entry} for {u}")
errored = by_id["bad-params"]
check(errored.type == "errored" and errored.error.error.type == "invalid_request_error", f"errored: {errored}")
check("max_tokens" in errored.error.error.message, f"errored message: {errored}")
check("label" in json.loads(by_id["structured"].message.content[0].text), "structured output")
billed = [x for x in ledger() if x["batch_id"] == batch.id and x["outcome"] == "succeeded"]
check(len(billed) == 5, f"errored requests are not billed: {billed}")

# Cancel: canceling, then ended with canceled results.
update_config(lambda c: c["processing"].update({"requests_per_second": 0.01}))
cb = client.messages.batches.create(requests=[request(f"c-{i}", "slow") for i in range(3)])
advance(3)
cb = client.messages.batches.cancel(cb.id)
check(cb.processing_status == "canceling" and cb.cancel_initiated_at is not None, f"canceling: {cb}")
e = expect_error(anthropic.BadRequestError, client.messages.batches.delete, cb.id)
check(e.body["error"]["type"] == "invalid_request_error", f"delete while canceling: {e.body}")
advance(60)
cb = client.messages.batches.retrieve(cb.id)
check(cb.processing_status == "ended" and cb.request_counts.canceled == 3, f"canceled: {cb}")
check({r.result.type for r in client.messages.batches.results(cb.id)} == {"canceled"}, "canceled results")
update_config(lambda c: c["processing"].update({"requests_per_second": 1000}))

# List across pages, newest first.
third = client.messages.batches.create(requests=[request("t-1", "hi")])
ids = [x.id for x in client.messages.batches.list(limit=2)]
check(ids == [third.id, cb.id, batch.id], f"list across pages: {ids}")
page = client.messages.batches.list(limit=1, before_id=batch.id)
check([x.id for x in page.data] == [cb.id], f"before_id: {page.data}")

# Delete an ended batch; then it is gone.
advance(60)
deleted = client.messages.batches.delete(cb.id)
check(deleted.type == "message_batch_deleted" and deleted.id == cb.id, f"delete: {deleted}")
e = expect_error(anthropic.NotFoundError, client.messages.batches.retrieve, cb.id)
check(e.body["type"] == "error" and e.body["error"]["type"] == "not_found_error", f"404: {e.body}")
check(e.body["request_id"] == e.response.headers["request-id"], "request-id header and body agree")

# custom_id rules are checked at create.
e = expect_error(anthropic.BadRequestError, client.messages.batches.create, requests=[request("ticket:1", "x")])
check("custom_id" in e.body["error"]["message"], f"bad custom_id: {e.body}")
e = expect_error(
    anthropic.BadRequestError, client.messages.batches.create, requests=[request("a", "x"), request("a", "y")]
)
check("Duplicate" in e.body["error"]["message"], f"duplicate custom_id: {e.body}")

# Auth and injected faults parse as the SDK's own errors.
wrong = anthropic.Anthropic(base_url=BASE, api_key="wrong", max_retries=0)
e = expect_error(anthropic.AuthenticationError, wrong.messages.batches.list)
check(e.body["error"]["type"] == "authentication_error", f"401: {e.body}")
update_config(lambda c: c.update({"faults": [
    {"provider": "anthropic", "operation": "retrieve", "status": 529},
    {"provider": "anthropic", "operation": "list", "status": 429, "retry_after": 2},
]}))
e = expect_error(anthropic.OverloadedError, client.messages.batches.retrieve, batch.id)
check(e.body["error"]["type"] == "overloaded_error", f"529: {e.body}")
e = expect_error(anthropic.RateLimitError, client.messages.batches.list)
check(e.response.headers.get("retry-after") == "2", "retry-after")
update_config(lambda c: c.update({"faults": []}))
print("anthropic SDK", anthropic.__version__, "ok")
