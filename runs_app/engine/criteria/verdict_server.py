"""The `submit_verdict` tool of an `agent_judge`: a stdio MCP server the judge's Claude Code CLI
starts inside the trial's sandbox (`python3 verdict_server.py`), and the verdict's rules.

Standard library only and self-contained: it is copied into the sandbox and run there. The
server answers `initialize`, `tools/list` and `tools/call` (JSON-RPC, one message a line); a
call whose arguments fail `checked_verdict` is answered "Invalid: ... Retry." so the judge can
call again. The verdict itself is read from the judge's recorded tool calls, the last one
winning (`agent_judge.verdict_of`), with the same `checked_verdict`: coder-eval's JudgeVerdict
(a score that is a finite number, not a boolean, clamped to [0, 1]; a rationale that is a
string, its whitespace collapsed, not empty; findings kept when they are a list).
"""

import json
import math
import sys

TOOL = "submit_verdict"
SCHEMA = {
    "type": "object",
    "properties": {
        "score": {"type": "number", "description": "0.0 (does not meet the instructions) to 1.0 (fully)"},
        "rationale": {"type": "string", "description": "1-2 sentence headline summary"},
        "findings": {"type": "array", "items": {"type": "string"}, "description": "Concrete observations"},
    },
    "required": ["score"],
}
DESCRIPTION = "Submit your final score, rationale, and findings. Call exactly once as your terminal action."


def checked_verdict(arguments):
    """(verdict, None) or (None, what is wrong), as coder-eval's JudgeVerdict reads arguments."""
    if not isinstance(arguments, dict):
        return None, "the verdict is not an object"
    problems = []
    score: object = arguments.get("score")
    if "score" not in arguments:
        problems.append("score field missing in judge verdict")
    elif isinstance(score, bool):
        problems.append(f"score field is not a number: {score!r}")
    else:
        try:
            number = float(score)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            problems.append(f"score field is not a number: {score!r}")
        else:
            if not math.isfinite(number):
                problems.append(f"score field is not a finite number: {score!r}")
            score = max(0.0, min(1.0, number)) if math.isfinite(number) else None
    rationale = arguments.get("rationale")
    if rationale is None:
        rationale = ""
    if not isinstance(rationale, str):
        problems.append(f"rationale field must be a string, got {type(rationale).__name__}")
    else:
        rationale = " ".join(rationale.split())
        if not rationale:
            problems.append("rationale field is empty after whitespace collapse")
    findings = arguments.get("findings")
    findings = (
        [str(item).strip() for item in findings if item is not None and str(item).strip()]
        if isinstance(findings, list)
        else []
    )
    if problems:
        return None, "; ".join(problems)
    return {"score": score, "rationale": rationale, "findings": findings}, None


def reply(message):
    """The answer to one JSON-RPC message (None for a notification)."""
    method, ident = message.get("method"), message.get("id")
    if ident is None:
        return None
    result: dict
    if method == "initialize":
        version = (message.get("params") or {}).get("protocolVersion") or "2024-11-05"
        result = {"protocolVersion": version, "capabilities": {"tools": {}},
                  "serverInfo": {"name": "evalsite_judge", "version": "1.0.0"}}  # fmt: skip
    elif method == "tools/list":
        result = {"tools": [{"name": TOOL, "description": DESCRIPTION, "inputSchema": SCHEMA}]}
    elif method == "tools/call":
        params = message.get("params") or {}
        if params.get("name") != TOOL:
            return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32602, "message": "unknown tool"}}
        verdict, problem = checked_verdict(params.get("arguments"))
        text = f"Invalid: {problem}. Retry." if problem else "Verdict received. Stop here."
        result = {"content": [{"type": "text", "text": text}], "isError": verdict is None}
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": f"no method {method}"}}
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def main():
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        answer = reply(message) if isinstance(message, dict) else None
        if answer is not None:
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
