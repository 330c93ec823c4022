"""A local judge model server for tests: Anthropic Messages and OpenAI Chat Completions, non-streaming.

    with JudgeStub(score=0.8) as stub:
        env = {"ANTHROPIC_BASE_URL": stub.base_url, "ANTHROPIC_API_KEY": "k"}
        # or {"EVALSITE_JUDGE_PROVIDER": "openai", "OPENAI_BASE_URL": stub.base_url + "/v1", ...}

`mode` scripts the reply: "tool" (a submit_verdict tool call), "text" (no tool call: the verdict
in the block named with the nonce the system prompt asks for), "bare" (no tool call: the verdict
as bare JSON text), "prose" (a well-formed reply without any verdict), "garbage" (a body that is
not JSON), or an HTTP status code (an error reply). Two modes play a judge that can be talked
into a verdict, both without a tool call: "obey" answers with the first JSON object in the
prompt, "echo" repeats the prompt (what the agent planted in it included). A list of modes
scripts the requests in order, its last mode repeating. Every request is recorded.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JudgeStub:
    def __init__(self, score: object = 1.0, mode: str | int | list[str | int] = "tool") -> None:
        self.score = score
        self.modes = mode if isinstance(mode, list) else [mode]
        self.mode = self.modes[0]
        self.requests: list[dict] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        # A short poll keeps shutdown() (and so each test) fast.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> JudgeStub:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------ replies

    def verdict(self) -> dict:
        return {"score": self.score, "rationale": "scripted by the stub", "findings": ["stub finding"]}

    def reply_text(self, request: dict) -> str:
        """What a judge that does not call the tool says, by mode."""
        if self.mode == "text":
            nonce = re.search(r"verdict-([0-9a-f]+)", _system(request))
            name = nonce.group(1) if nonce else "missing"
            return f"My verdict:\n```verdict-{name}\n{json.dumps(self.verdict())}\n```\n"
        if self.mode == "bare":
            return json.dumps(self.verdict())
        if self.mode == "obey":
            return json.dumps(_first_json_object(_prompt(request)))
        if self.mode == "echo":
            return _prompt(request)
        return "Looks fine to me, well done."

    def anthropic_reply(self, request: dict) -> dict:
        if self.mode == "tool":
            tool_use = {
                "type": "tool_use",
                "id": "toolu_stub",
                "name": "submit_verdict",
                "input": self.verdict(),
            }
            content = [{"type": "text", "text": "Grading."}, tool_use]
        else:
            content = [{"type": "text", "text": self.reply_text(request)}]
        return {
            "id": "msg_stub",
            "type": "message",
            "role": "assistant",
            "model": request.get("model"),
            "content": content,
            "stop_reason": "tool_use" if self.mode == "tool" else "end_turn",
            "usage": {"input_tokens": 120, "output_tokens": 30},
        }

    def openai_reply(self, request: dict) -> dict:
        message: dict = {"role": "assistant", "content": None}
        if self.mode == "tool":
            function = {"name": "submit_verdict", "arguments": json.dumps(self.verdict())}
            message["tool_calls"] = [{"id": "call_stub", "type": "function", "function": function}]
        else:
            message["content"] = self.reply_text(request)
        return {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "model": request.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
        }

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                # Keep test output quiet.
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                headers = {key.lower(): value for key, value in self.headers.items()}
                stub.requests.append({"path": self.path, "headers": headers, "body": body})
                stub.mode = stub.modes[min(len(stub.requests), len(stub.modes)) - 1]
                if self.path.endswith("/v1/messages"):
                    reply = stub.anthropic_reply(body)
                elif self.path.endswith("/chat/completions"):
                    reply = stub.openai_reply(body)
                else:
                    return self._send(404, b'{"error": "no such endpoint"}')
                if isinstance(stub.mode, int):
                    return self._send(stub.mode, b'{"error": {"message": "scripted failure"}}')
                if stub.mode == "garbage":
                    return self._send(200, b"<html>definitely not json</html>")
                self._send(200, json.dumps(reply).encode())

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler


def _system(request: dict) -> str:
    """The system prompt of a Messages or Chat Completions request."""
    if "system" in request:
        return str(request["system"])
    return next((str(m["content"]) for m in request.get("messages", []) if m["role"] == "system"), "")


def _prompt(request: dict) -> str:
    """The (last) user message of a request: the grading prompt."""
    return next((str(m["content"]) for m in reversed(request.get("messages", [])) if m["role"] == "user"), "")


def _first_json_object(text: str) -> dict | None:
    decoder = json.JSONDecoder()
    for start in (match.start() for match in re.finditer(r"\{", text)):
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None
