"""Scriptable local model servers for tests: the Anthropic Messages API, the OpenAI Responses and
Chat Completions APIs, and the Gemini API's generateContent.

Both stream Server-Sent Events like the real APIs, listen on 127.0.0.1 at a free port, run in a
daemon thread and are used as context managers:

    with AnthropicMock([Turn([tool_use("Bash", {"command": "ls"})]), Turn([text("done")])]) as api:
        ... point the CLI at api.url ...

The script is indexed by the conversation's step: the number of tool results already in the request
(a CLI sends the whole conversation each time), so side requests cannot shift it. A step past the
end of the script answers with a final text. ``error=HttpError(...)`` makes every model request fail.
``responder=f`` (Anthropic) instead picks each answer from the request: ``f(body)`` returns the Turn,
for conversations whose course depends on what was said (a simulated user, a judge).
Each server records the requests it got (``requests``) and the usage it reported (``sent_usage``).
"""

from __future__ import annotations

import base64
import json
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class HttpError:
    status: int
    type: str
    message: str


@dataclass
class Turn:
    """One model response: Anthropic content blocks or OpenAI output items, or an HTTP error."""

    output: list[dict[str, Any]] = field(default_factory=list)
    error: HttpError | None = None
    delay: float = 0.0  # seconds to wait before answering (lets a test act mid-run)


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:20], "name": name, "input": tool_input}


def message(value: str) -> dict[str, Any]:
    return {"type": "message", "text": value}


def shell(command: str) -> dict[str, Any]:
    """A shell tool call; the tool's name and argument shape are picked from what Codex offers."""
    return {"type": "shell", "command": command}


def patch(body: str) -> dict[str, Any]:
    return {"type": "apply_patch", "input": body}


class MockServer:
    def __init__(
        self,
        turns: list[Turn] | None = None,
        *,
        error: HttpError | None = None,
        responder: Callable[[dict[str, Any]], Turn] | None = None,
    ) -> None:
        self.turns = turns or []
        self.error = error
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self.sent_usage: list[dict[str, int]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "use the server as a context manager first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> MockServer:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.daemon = True
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def record(self, method: str, path: str, headers: dict[str, str], body: Any) -> None:
        with self._lock:
            self.requests.append({"method": method, "path": path, "headers": headers, "body": body})

    def model_requests(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def respond(self, handler: _Handler, path: str, body: dict[str, Any]) -> None:
        raise NotImplementedError

    def turn_for(self, step: int) -> Turn | None:
        return self.turns[step] if step < len(self.turns) else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mock: MockServer

    def log_message(self, *args: object) -> None:
        pass  # keep test output clean

    def do_GET(self) -> None:
        self.mock.record("GET", self.path, dict(self.headers), None)
        if self.path.split("?")[0].rstrip("/").endswith("/models"):
            self.send_json(200, {"object": "list", "data": [], "models": []})
        else:
            self.send_json(404, {"error": {"type": "not_found_error", "message": "not found (mock)"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = {}
        self.mock.record("POST", self.path, dict(self.headers), body)
        self.mock.respond(self, self.path.split("?")[0], body)

    def send_json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("request-id", "req_mock_" + uuid.uuid4().hex[:12])
        self.end_headers()
        self.wfile.write(data)

    def start_sse(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.send_header("request-id", "req_mock_" + uuid.uuid4().hex[:12])
        self.end_headers()
        self.close_connection = True

    def sse(self, name: str, obj: dict[str, Any]) -> None:
        self.wfile.write(f"event: {name}\ndata: {json.dumps(obj)}\n\n".encode())
        self.wfile.flush()

    def start_eventstream(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/vnd.amazon.eventstream")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True

    def bedrock_chunk(self, name: str, obj: dict[str, Any]) -> None:
        """One AWS event-stream frame holding an Anthropic event, as Bedrock streams them."""
        payload = json.dumps({"bytes": base64.b64encode(json.dumps(obj).encode()).decode()}).encode()
        headers = b"".join(
            bytes([len(key)]) + key.encode() + b"\x07" + struct.pack(">H", len(value)) + value.encode()
            for key, value in ((":event-type", "chunk"), (":content-type", "application/json"),
                               (":message-type", "event"))
        )  # fmt: skip
        prelude = struct.pack(">II", 16 + len(headers) + len(payload), len(headers))
        prelude += struct.pack(">I", zlib.crc32(prelude))
        frame = prelude + headers + payload
        self.wfile.write(frame + struct.pack(">I", zlib.crc32(frame)))
        self.wfile.flush()

    def sse_data(self, obj: Any) -> None:
        """An unnamed event, as Chat Completions and Gemini stream them."""
        self.wfile.write(f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode())
        self.wfile.flush()


def _handler_for(mock: MockServer) -> type[_Handler]:
    return type("BoundHandler", (_Handler,), {"mock": mock})


class AnthropicMock(MockServer):
    """POST /v1/messages with ``stream: true``. Usage per step: input 1000+200*step, cache write 100,
    cache read 250*step, output 20+5*step (distinct per step so sums are checkable)."""

    def model_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == "POST" and _claude_call(r["path"].split("?")[0])]

    def respond(self, handler: _Handler, path: str, body: dict[str, Any]) -> None:
        kind = _claude_call(path)
        if kind is None:
            handler.send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": "mock"}})
            return
        # Vertex and Bedrock name the model in the path, not the body.
        model = body.get("model") or (path.rpartition("/models/")[2].partition(":")[0] if kind == "vertex"
                                      else path.partition("/model/")[2].partition("/")[0])  # fmt: skip
        step = _count_items(body.get("messages") or [], ("tool_result",))
        if self.responder is not None:
            turn = self.responder(body)
        else:
            turn = self.turn_for(step) if body.get("tools") else Turn([text("ok")])
        error = self.error or (turn.error if turn else None)
        if turn and turn.delay:
            time.sleep(turn.delay)
        if error:
            handler.send_json(
                error.status, {"type": "error", "error": {"type": error.type, "message": error.message}}
            )
            return
        blocks = turn.output if turn else [text("Done.")]
        if kind == "anthropic" and not body.get("stream"):  # a worker's own call: the answerer, a judge
            self._reply(handler, model or "claude-sonnet-4-6", blocks, step)
            return
        handler.start_sse() if kind != "bedrock" else handler.start_eventstream()
        emit = handler.sse if kind != "bedrock" else handler.bedrock_chunk
        self._stream(emit, model or "claude-sonnet-4-6", blocks, step)

    def _reply(self, handler: _Handler, model: str, blocks: list[dict[str, Any]], step: int) -> None:
        """One JSON message, as the Messages API answers a request without `stream`."""
        usage = {"input_tokens": 300 + 10 * step, "output_tokens": 40, "cache_read_input_tokens": 0,
                 "cache_creation_input_tokens": 0}  # fmt: skip
        with self._lock:
            self.sent_usage.append(dict(usage))
        stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
        handler.send_json(
            200,
            {"id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant", "model": model,
             "content": blocks, "stop_reason": stop, "stop_sequence": None, "usage": usage},
        )  # fmt: skip

    def _stream(self, emit: Any, model: str, blocks: list[dict[str, Any]], step: int) -> None:
        usage = {
            "input_tokens": 1000 + 200 * step,
            "cache_creation_input_tokens": 100,
            "cache_read_input_tokens": 250 * step,
        }
        output_tokens = 20 + 5 * step
        with self._lock:
            self.sent_usage.append({**usage, "output_tokens": output_tokens})
        stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
        start = {"id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant", "model": model}
        start.update(content=[], stop_reason=None, stop_sequence=None, usage={**usage, "output_tokens": 1})
        emit("message_start", {"type": "message_start", "message": start})
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                opening = {"type": "text", "text": ""}
                delta = {"type": "text_delta", "text": block["text"]}
            else:
                opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            emit(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            )
            emit("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            emit("content_block_stop", {"type": "content_block_stop", "index": index})
        emit(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
        )
        emit("message_stop", {"type": "message_stop"})


def _claude_call(path: str) -> str | None:
    """Which API a Claude request speaks: the Messages API, Vertex's or Bedrock's, or None."""
    if path.startswith("/v1/messages") and not path.endswith("count_tokens"):
        return "anthropic"
    if path.endswith(":streamRawPredict"):
        return "vertex"
    if path.endswith("/invoke-with-response-stream"):
        return "bedrock"
    return None


class OpenAIMock(MockServer):
    """POST /v1/responses with ``stream: true``. Usage per step: input 800+150*step (including
    cached), cached 100*step, output 25+step, reasoning 4. ``fail_stream`` ends every stream with
    ``response.failed``."""

    def __init__(
        self, turns: list[Turn] | None = None, *, error: HttpError | None = None, fail_stream: bool = False
    ) -> None:
        super().__init__(turns, error=error)
        self.fail_stream = fail_stream

    def model_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == "POST" and r["path"].endswith("/responses")]

    def respond(self, handler: _Handler, path: str, body: dict[str, Any]) -> None:
        if not path.endswith("/responses"):
            handler.send_json(
                404, {"error": {"type": "invalid_request_error", "message": "not found (mock)"}}
            )
            return
        kinds = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")
        step = _count_items(body.get("input") or [], kinds, nested=False)
        turn = self.turn_for(step)
        error = self.error or (turn.error if turn else None)
        if turn and turn.delay:
            time.sleep(turn.delay)
        if error:
            handler.send_json(
                error.status, {"error": {"type": error.type, "message": error.message, "code": error.type}}
            )
            return
        planned = turn.output if turn else [message("Done.")]
        items = [_openai_item(p, body.get("tools") or []) for p in planned]
        self._stream(handler, body.get("model") or "gpt-mock", items, step)

    def _stream(self, handler: _Handler, model: str, items: list[dict[str, Any]], step: int) -> None:
        usage = {
            "input_tokens": 800 + 150 * step,
            "input_tokens_details": {"cached_tokens": 100 * step},
            "output_tokens": 25 + step,
            "output_tokens_details": {"reasoning_tokens": 4},
        }
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        response = {
            "id": "resp_" + uuid.uuid4().hex[:24],
            "object": "response",
            "created_at": int(time.time()),
        }
        response.update(model=model, status="in_progress", output=[], usage=None, error=None)
        handler.start_sse()
        seq = iter(range(10_000))

        def emit(kind: str, **fields: Any) -> None:
            handler.sse(kind, {"type": kind, "sequence_number": next(seq), **fields})

        emit("response.created", response=response)
        emit("response.in_progress", response=response)
        if self.fail_stream:
            failed = {
                **response,
                "status": "failed",
                "error": {"code": "server_error", "message": "model failed (mock)"},
            }
            emit("response.failed", response=failed)
            return
        for index, item in enumerate(items):
            _emit_item(emit, index, item)
        with self._lock:
            self.sent_usage.append(usage)
        emit(
            "response.completed",
            response={**response, "status": "completed", "output": items, "usage": usage},
        )


class ChatMock(MockServer):
    """POST .../chat/completions, streamed (with the usage chunk) or not. A request offering tools
    is at the step of its tool results; one without (Aider) at the count of such requests before
    it. Usage per step: prompt 900+100*step (cached 50*step included), completion 30+step."""

    def __init__(self, turns: list[Turn] | None = None, *, error: HttpError | None = None) -> None:
        super().__init__(turns, error=error)
        self._plain = 0

    def model_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == "POST" and r["path"].endswith("/chat/completions")]

    def respond(self, handler: _Handler, path: str, body: dict[str, Any]) -> None:
        if not path.endswith("/chat/completions"):
            handler.send_json(
                404, {"error": {"type": "invalid_request_error", "message": "not found (mock)"}}
            )
            return
        messages = body.get("messages") or []
        if body.get("tools"):
            step = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "tool")
        else:
            with self._lock:
                step, self._plain = self._plain, self._plain + 1
        turn = self.turn_for(step)
        error = self.error or (turn.error if turn else None)
        if error:
            handler.send_json(error.status, {"error": {"type": error.type, "message": error.message}})
            return
        content, calls = "", []
        for planned in turn.output if turn else [message("Done.")]:
            if planned["type"] in ("message", "text"):
                content += planned["text"]
            else:
                calls.append(_chat_call(planned, body.get("tools") or []))
        usage = {
            "prompt_tokens": 900 + 100 * step, "completion_tokens": 30 + step,
            "prompt_tokens_details": {"cached_tokens": 50 * step},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }  # fmt: skip
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        with self._lock:
            self.sent_usage.append(usage)
        model = body.get("model") or "gpt-mock"
        finish = "tool_calls" if calls else "stop"
        ids = {"id": "chatcmpl-" + uuid.uuid4().hex[:20], "created": int(time.time()), "model": model}
        if not body.get("stream"):
            reply = {
                "role": "assistant",
                "content": content or None,
                **({"tool_calls": calls} if calls else {}),
            }
            choice = {"index": 0, "message": reply, "finish_reason": finish}
            handler.send_json(200, {**ids, "object": "chat.completion", "usage": usage, "choices": [choice]})
            return
        handler.start_sse()

        def chunk(delta: dict[str, Any], reason: str | None = None) -> None:
            choice = {"index": 0, "delta": delta, "finish_reason": reason}
            handler.sse_data({**ids, "object": "chat.completion.chunk", "choices": [choice]})

        chunk({"role": "assistant", "content": ""})
        if content:
            chunk({"content": content})
        for index, call in enumerate(calls):
            chunk({"tool_calls": [{"index": index, **call}]})
        chunk({}, finish)
        if (body.get("stream_options") or {}).get("include_usage"):
            handler.sse_data({**ids, "object": "chat.completion.chunk", "choices": [], "usage": usage})
        handler.sse_data("[DONE]")


def _chat_call(planned: dict[str, Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
    offered = [(t.get("function") or {}).get("name") for t in tools]
    if planned["type"] == "shell":
        name = next((n for n in ("bash", "shell", "Bash") if n in offered), "bash")
        args = {"command": planned["command"], "description": "run a command"}
    else:
        name, args = planned["name"], planned["input"]
    return {"id": "call_" + uuid.uuid4().hex[:16], "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}  # fmt: skip


class GeminiMock(MockServer):
    """POST /v1beta/models/{model}:streamGenerateContent?alt=sse (or :generateContent), at the step
    of the function responses in its contents. ``shell(...)`` calls run_shell_command. Usage per
    step: prompt 1000+200*step (cached 100*step included), candidates 20+step, thoughts 3."""

    def model_requests(self) -> list[dict[str, Any]]:
        kinds = (":generateContent", ":streamGenerateContent")
        return [r for r in self.requests if r["method"] == "POST" and any(k in r["path"] for k in kinds)]

    def respond(self, handler: _Handler, path: str, body: dict[str, Any]) -> None:
        model, _, method = path.rpartition("/models/")[2].partition(":")
        if method not in ("generateContent", "streamGenerateContent"):
            handler.send_json(
                404, {"error": {"code": 404, "message": "not found (mock)", "status": "NOT_FOUND"}}
            )
            return
        contents = body.get("contents") or []
        step = sum(
            1 for c in contents if isinstance(c, dict) for p in c.get("parts") or []
            if isinstance(p, dict) and "functionResponse" in p
        )  # fmt: skip
        turn = self.turn_for(step)
        error = self.error or (turn.error if turn else None)
        if error:
            handler.send_json(error.status, {"error": {"code": error.status, "message": error.message,
                                                       "status": error.type}})  # fmt: skip
            return
        parts = []
        for planned in turn.output if turn else [message("Done.")]:
            if planned["type"] in ("message", "text"):
                parts.append({"text": planned["text"]})
            elif planned["type"] == "shell":
                parts.append(
                    {"functionCall": {"name": "run_shell_command", "args": {"command": planned["command"]}}}
                )
            else:
                parts.append({"functionCall": {"name": planned["name"], "args": planned["input"]}})
        usage = {
            "promptTokenCount": 1000 + 200 * step, "cachedContentTokenCount": 100 * step,
            "candidatesTokenCount": 20 + step, "thoughtsTokenCount": 3,
        }  # fmt: skip
        usage["totalTokenCount"] = usage["promptTokenCount"] + usage["candidatesTokenCount"] + 3
        with self._lock:
            self.sent_usage.append(usage)
        answer = {
            "candidates": [
                {"content": {"role": "model", "parts": parts}, "index": 0, "finishReason": "STOP"}
            ],
            "usageMetadata": usage,
            "modelVersion": model,
        }
        if method == "generateContent":
            handler.send_json(200, answer)
            return
        handler.start_sse()
        handler.sse_data(answer)


def _emit_item(emit: Any, index: int, item: dict[str, Any]) -> None:
    item_id = item["id"]
    if item["type"] == "message":
        value = item["content"][0]["text"]
        emit(
            "response.output_item.added",
            output_index=index,
            item={**item, "status": "in_progress", "content": []},
        )
        part = {"type": "output_text", "text": "", "annotations": []}
        ids = {"item_id": item_id, "output_index": index, "content_index": 0}
        emit("response.content_part.added", **ids, part=part)
        emit("response.output_text.delta", **ids, delta=value)
        emit("response.output_text.done", **ids, text=value)
        emit("response.content_part.done", **ids, part={**part, "text": value})
    elif item["type"] == "function_call":
        emit(
            "response.output_item.added",
            output_index=index,
            item={**item, "status": "in_progress", "arguments": ""},
        )
        ids = {"item_id": item_id, "output_index": index}
        emit("response.function_call_arguments.delta", **ids, delta=item["arguments"])
        emit("response.function_call_arguments.done", **ids, arguments=item["arguments"])
    else:  # custom_tool_call (apply_patch's freeform grammar)
        emit(
            "response.output_item.added",
            output_index=index,
            item={**item, "status": "in_progress", "input": ""},
        )
        ids = {"item_id": item_id, "output_index": index}
        emit("response.custom_tool_call_input.delta", **ids, delta=item["input"])
        emit("response.custom_tool_call_input.done", **ids, input=item["input"])
    emit("response.output_item.done", output_index=index, item=item)


def _openai_item(planned: dict[str, Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """Turn a planned step into a Responses API output item using the tools the client offered."""
    call_id = "call_" + uuid.uuid4().hex[:20]
    if planned["type"] == "message":
        content = [{"type": "output_text", "text": planned["text"], "annotations": []}]
        return {
            "id": "msg_" + uuid.uuid4().hex[:20],
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": content,
        }
    offered = {(t.get("name") or (t.get("function") or {}).get("name")): t.get("type") for t in tools}
    if planned["type"] == "shell":
        if "exec_command" in offered:
            name, args = "exec_command", {"cmd": planned["command"], "yield_time_ms": 10000}
        elif "shell_command" in offered:
            name, args = "shell_command", {"command": planned["command"]}
        else:
            name, args = "shell", {"command": ["bash", "-lc", planned["command"]]}
        return _function_call(call_id, name, args)
    if offered.get("apply_patch") == "custom":
        return {"id": "ctc_" + uuid.uuid4().hex[:20], "type": "custom_tool_call", "status": "completed",
                "call_id": call_id, "name": "apply_patch", "input": planned["input"]}  # fmt: skip
    return _function_call(call_id, "apply_patch", {"input": planned["input"]})


def _function_call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": "fc_" + uuid.uuid4().hex[:20], "type": "function_call", "status": "completed",
            "call_id": call_id, "name": name, "arguments": json.dumps(args)}  # fmt: skip


def _count_items(entries: list[Any], kinds: tuple[str, ...], *, nested: bool = True) -> int:
    """Tool results already in the conversation: Anthropic nests them in message content lists."""
    count = 0
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        if nested and isinstance(entry.get("content"), list):
            count += sum(1 for b in entry["content"] if isinstance(b, dict) and b.get("type") in kinds)
        elif not nested and entry.get("type") in kinds:
            count += 1
    return count
