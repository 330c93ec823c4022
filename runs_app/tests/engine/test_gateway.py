"""The model gateway through a real worker, for a `command` agent with a plain OpenAI-compatible
client (no output protocol): its calls are counted and priced, its key is a placeholder, and each
budget stops it within one model call. Then the gateway's usage reading on every API shape."""

import json

import pytest

from conftest import WorkerProcess, purge_broker
from runs_app.engine.gateway import PLACEHOLDER_KEY, Call
from runs_app.engine.gateway.proxy import _UsageReader
from runs_app.engine.usage import Usage
from runs_app.launching import launch_run
from runs_app.models import Trial, TrialEvent
from runs_app.tests.factories import import_folder_tasks, make_experiment, make_task
from runs_app.tests.mock_servers import OpenAIMock
from runs_app.tests.workers import wait_for_run

REAL_KEY = "sk-test-real-openai-key-0123456789"

CLIENT = """
import json, os, urllib.request
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
with open("env.txt", "w") as f:
    f.write("\\n".join(f"{k}={v}" for k, v in os.environ.items()))
for i in range(int(os.environ["CALLS"])):
    body = {"model": "gpt-5-mini", "input": [{"role": "user", "content": "hi"}], "stream": True}
    request = urllib.request.Request(
        base + "/responses", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
        print("call", i, "ok", flush=True)
    except Exception as exc:
        print("call", i, "refused", exc, flush=True)
open("out.txt", "w").write("done")
"""
# Every mock call: 800 input tokens, 25 output; at these prices $0.00085.
PRICES = {"input": 1.0, "output": 2.0}
BUDGETS = {
    "max_total_tokens": 1500,
    "max_input_tokens": 1000,
    "max_output_tokens": 40,
    "max_usd": 0.0015,
    "max_turns": 2,
}


def variant(slug: str, calls: int, limits: dict | None = None) -> dict:
    agent = {
        "type": "command",
        "command": ["python3", "-c", CLIENT],
        "env": {"CALLS": str(calls)},
        "prices": PRICES,
    }
    return {"variant_id": slug, "agent": agent, **({"run_limits": limits} if limits else {})}


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(240)
def test_a_command_agent_is_counted_priced_keyless_and_stopped_by_each_budget(tmp_path):
    make_task(
        tmp_path,
        "call",
        "task_id: call\ninitial_prompt: x\nsuccess_criteria: [{type: file_exists, path: env.txt}]\n",
    )
    import_folder_tasks(tmp_path)
    variants = [variant("plain", 1)] + [
        variant(name.replace("_", "-"), 20, {name: cap}) for name, cap in BUDGETS.items()
    ]
    experiment = make_experiment(
        tmp_path, json.dumps({"experiment_id": "gateway", "max_parallel": 2, "variants": variants})
    )
    with OpenAIMock() as api:
        purge_broker()
        worker = WorkerProcess(
            tmp_path, extra_env={"OPENAI_API_KEY": REAL_KEY, "OPENAI_BASE_URL": f"{api.url}/v1"}
        ).start()
        try:
            run = wait_for_run(launch_run(experiment), 200, worker)
        finally:
            worker.kill()
        requests = api.model_requests()

    trials = {t.variant.slug: t for t in Trial.objects.filter(run=run).select_related("variant")}
    plain = trials["plain"]
    assert plain.status == "passed", (plain.error_message, plain.agent_stderr[-1000:])
    assert (plain.input_tokens, plain.output_tokens, plain.turns) == (800, 25, 1)
    assert abs(plain.cost_usd - 0.00085) < 1e-12
    assert {r["headers"].get("Authorization") for r in requests} == {f"Bearer {REAL_KEY}"}
    assert f"OPENAI_API_KEY={PLACEHOLDER_KEY}" in plain.diff and REAL_KEY not in plain.diff
    for name in BUDGETS:
        trial = trials[name.replace("_", "-")]
        calls = TrialEvent.objects.filter(trial=trial, kind="usage", data__source="gateway", data__status=200)
        assert trial.budget_exceeded == name, (name, trial.status, trial.error_message)
        assert calls.count() <= 3, (name, calls.count())  # crossed at the 2nd call, stopped by the 3rd
        assert (
            TrialEvent.objects.filter(trial=trial, kind="usage", data__refused=name).exists()
            or name != "max_turns"
        )


def read(api: str, body: bytes) -> Call:
    call = Call(api, "/x", 200)
    reader = _UsageReader(api, call)
    reader.feed(body)
    reader.finish()
    return call


def test_it_reads_usage_from_every_api_shape():
    anthropic = read(
        "anthropic",
        json.dumps(
            {
                "type": "message",
                "model": "claude-haiku-4-5",
                "usage": {
                    "input_tokens": 10,
                    "output_tokens": 5,
                    "cache_read_input_tokens": 3,
                    "cache_creation_input_tokens": 2,
                },
            }
        ).encode(),
    )
    chat_stream = read(
        "openai",
        b"data: "
        + json.dumps(
            {
                "object": "chat.completion.chunk",
                "model": "gpt-4o",
                "usage": {
                    "prompt_tokens": 50,
                    "completion_tokens": 7,
                    "prompt_tokens_details": {"cached_tokens": 20},
                    "completion_tokens_details": {"reasoning_tokens": 2},
                },
            }
        ).encode()
        + b"\n\ndata: [DONE]\n\n",
    )
    responses = read(
        "openai",
        json.dumps(
            {
                "object": "response",
                "model": "gpt-5",
                "usage": {
                    "input_tokens": 30,
                    "output_tokens": 4,
                    "input_tokens_details": {"cached_tokens": 10},
                },
            }
        ).encode(),
    )

    assert (anthropic.model, anthropic.usage) == ("claude-haiku-4-5", Usage(10, 5, 3, 2))
    assert (chat_stream.model, chat_stream.usage) == ("gpt-4o", Usage(30, 7, 20, 0, reasoning_tokens=2))
    assert (responses.model, responses.usage) == ("gpt-5", Usage(20, 4, 10, 0))


def connect_through(gateway_socket, target: str) -> bytes:
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(gateway_socket))
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        return s.recv(4096)


def test_egress_reaches_only_allowed_public_hosts(tmp_path):
    from runs_app.engine.gateway import Gateway

    gateway = Gateway(tmp_path / "g.sock", [], allowed_hosts=["localtest.me", "example.test"]).start()
    try:
        assert connect_through(gateway.socket_path, "pypi.org:443").startswith(b"HTTP/1.1 403")
        # Listed, but resolving to the worker's own loopback (or not at all): refused too.
        assert connect_through(gateway.socket_path, "127.0.0.1:5432").startswith(b"HTTP/1.1 403")
        assert connect_through(gateway.socket_path, "example.test:443").startswith(b"HTTP/1.1 502")
    finally:
        gateway.close()


@pytest.mark.parametrize(
    ("sandbox", "message"),
    [
        ({"network": "bridge"}, "network: bridge needs allowed_hosts"),
        ({"network": "bridge", "allowed_hosts": ["localhost"]}, "must be a public host"),
        ({"network": "bridge", "allowed_hosts": ["10.0.0.5"]}, "must be a public host"),
        ({"network": "bridge", "allowed_hosts": ["https://pypi.org"]}, "must be a public host"),
        ({"allowed_hosts": ["pypi.org"]}, "allowed_hosts needs network: bridge"),
        ({"network": "host"}, "Input should be 'none' or 'bridge'"),
    ],
)
def test_egress_settings_are_checked_at_import(sandbox, message):
    from pydantic import ValidationError

    from experiments_app.specs import SandboxSpec

    with pytest.raises(ValidationError, match=message):
        SandboxSpec.model_validate(sandbox)
    assert SandboxSpec.model_validate({"network": "bridge", "allowed_hosts": ["pypi.org"]}).allowed_hosts
