"""The official `openai` SDK against tranche sim's Azure OpenAI surfaces: `AzureOpenAI` on the
dated `/openai/...?api-version=` surface and `OpenAI` on the v1 surface `/openai/v1/`, with
deployment names in `model`, the 14-30 day expiry range, the zero-byte error file of a successful
batch, and the input-file quota. Responses are parsed with strict validation."""

import json

import openai
from openai import AzureOpenAI, OpenAI
from openai.types.chat import ChatCompletion

from simctl import BASE, KEY, advance, chat_lines, check, expect_error, update_config

DEPLOYMENT = "gpt-4o-mini-batch"
TWO_WEEKS = 1_209_600

legacy = AzureOpenAI(
    azure_endpoint=BASE,
    api_key=KEY,
    api_version="2024-10-21",
    max_retries=0,
    _strict_response_validation=True,
)
v1 = OpenAI(base_url=f"{BASE}/openai/v1/", api_key=KEY, max_retries=0, _strict_response_validation=True)


def run_surface(client, name, endpoint):
    data = chat_lines(3, DEPLOYMENT, name, url="/v1/chat/completions")
    f = client.files.create(
        file=("input.jsonl", data),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": TWO_WEEKS},
    )
    check(f.expires_at == f.created_at + TWO_WEEKS, f"{name} upload: {f}")
    check(client.files.retrieve(f.id).bytes == len(data), f"{name} retrieve")
    # Azure accepts only 14-30 days.
    e = expect_error(
        openai.BadRequestError,
        client.files.create,
        file=("short.jsonl", data),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 3600},
    )
    check(e.code == "integer_below_min_value", f"{name} short expiry: {e.body}")

    b = client.batches.create(
        input_file_id=f.id,
        endpoint=endpoint,
        completion_window="24h",
        metadata={"surface": name},
        output_expires_after={"anchor": "created_at", "seconds": TWO_WEEKS},
    )
    check(b.status == "validating" and b.id.startswith("batch_"), f"{name} create: {b}")
    advance(60)
    b = client.batches.retrieve(b.id)
    check(b.status == "completed" and b.model == DEPLOYMENT, f"{name} completed: {b}")
    check(b.request_counts.completed == 3, f"{name} counts: {b.request_counts}")
    # "Successful jobs will still generate an error_file_id ... an empty file with zero bytes."
    check(b.error_file_id is not None, f"{name} error_file_id: {b}")
    check(client.files.retrieve(b.error_file_id).bytes == 0, f"{name} zero-byte error file")
    check(client.files.content(b.error_file_id).read() == b"", f"{name} empty error content")
    for line in client.files.content(b.output_file_id).text.splitlines():
        body = json.loads(line)["response"]["body"]
        ChatCompletion.model_validate(body)
        check("prompt_filter_results" in body, f"{name} content filter annotations")

    # A line naming another deployment fails the whole batch.
    mixed = chat_lines(1, DEPLOYMENT, name + "m") + chat_lines(1, "other-deployment", name + "o")
    mf = client.files.create(
        file=("mixed.jsonl", mixed),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": TWO_WEEKS},
    )
    mb = client.batches.create(input_file_id=mf.id, endpoint=endpoint, completion_window="24h")
    advance(10)
    mb = client.batches.retrieve(mb.id)
    check(mb.status == "failed" and mb.errors.data[0].code == "model_mismatch", f"{name} mismatch: {mb}")

    # Cancel.
    update_config(lambda c: c["processing"].update({"requests_per_second": 0.01}))
    cb = client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h")
    cb = client.batches.cancel(cb.id)
    check(cb.status == "cancelling", f"{name} cancelling: {cb}")
    advance(60)
    check(client.batches.retrieve(cb.id).status == "cancelled", f"{name} cancelled")
    update_config(lambda c: c["processing"].update({"requests_per_second": 1000}))

    listed = [x.id for x in client.batches.list(limit=1)]
    check(listed[:3] == [cb.id, mb.id, b.id], f"{name} batches across pages: {listed}")
    files = [x.id for x in client.files.list(purpose="batch", limit=1)]
    check(files[:2] == [mf.id, f.id], f"{name} files across pages: {files}")

    check(client.files.delete(f.id).deleted, f"{name} delete")
    expect_error(openai.NotFoundError, client.files.retrieve, f.id)


run_surface(legacy, "legacy", "/chat/completions")
run_surface(v1, "v1", "/v1/chat/completions")

# api-version: missing or unknown is refused as Azure does.
old = AzureOpenAI(azure_endpoint=BASE, api_key=KEY, api_version="2023-05-15", max_retries=0)
e = expect_error(openai.BadRequestError, old.files.list)
check(e.body == {"code": "BadRequest", "message": "API version not supported"}, f"version: {e.body}")
wrong = AzureOpenAI(azure_endpoint=BASE, api_key="wrong", api_version="2024-10-21", max_retries=0)
e = expect_error(openai.AuthenticationError, wrong.batches.list)
check(e.body["code"] == "401", f"401: {e.body}")

# The input-file quota: with a limit of 3, the 4th upload without expiry is a 400 quotaExceeded.
update_config(lambda c: c["azure"].update({"max_input_files_without_expiry": 3}))
for i in range(3):
    legacy.files.create(file=(f"q{i}.jsonl", b"{}\n"), purpose="batch")
e = expect_error(openai.BadRequestError, legacy.files.create, file=("q3.jsonl", b"{}\n"), purpose="batch")
check(e.response.status_code == 400, "quota status")
check(
    e.response.json() == {"error": {"code": "quotaExceeded", "message": "The quota for files without expiry is reached. The maximum is 3."}},
    f"quota body: {e.response.text}",
)
# Files with an expiry have their own allowance.
legacy.files.create(
    file=("ok.jsonl", b"{}\n"), purpose="batch", expires_after={"anchor": "created_at", "seconds": TWO_WEEKS}
)

# The legacy quirks (ISO timestamps, capitalised statuses) are not what the SDK's types say:
# strict parsing must notice them.
update_config(lambda c: c["azure"].update({"legacy_quirks": True}))
expect_error(openai.APIResponseValidationError, legacy.batches.list)
update_config(lambda c: c["azure"].update({"legacy_quirks": False}))
print("azure (openai SDK", openai.__version__ + ") ok")
