"""Local receivers for alerts, in threads of the test process: an SMTP server that keeps every
message it is sent, and a webhook endpoint that keeps every JSON body POSTed to it. A worker
process (or the test itself) delivers to them over real sockets."""

import email
import json
import socketserver
import threading
import time
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class SmtpSink:
    """Just enough SMTP (HELO/EHLO, MAIL, RCPT, DATA, QUIT, RSET, NOOP) to take mail from
    Django's SMTP backend."""

    def __init__(self):
        self.messages: list[Message] = []
        sink = self

        class Handler(socketserver.StreamRequestHandler):
            def reply(self, line: str) -> None:
                self.wfile.write(f"{line}\r\n".encode())

            def handle(self) -> None:
                self.reply("220 sink ready")
                while line := self.rfile.readline():
                    verb = line.decode(errors="replace").strip().split(" ", 1)[0].upper()
                    if verb == "EHLO":
                        self.reply("250-sink")
                        self.reply("250 8BITMIME")
                    elif verb == "DATA":
                        self.reply("354 end with <CRLF>.<CRLF>")
                        data = b""
                        while (chunk := self.rfile.readline()) not in (b".\r\n", b""):
                            data += chunk[1:] if chunk.startswith(b"..") else chunk
                        sink.messages.append(email.message_from_bytes(data))
                        self.reply("250 kept")
                    elif verb == "QUIT":
                        self.reply("221 bye")
                        return
                    else:  # HELO, MAIL, RCPT, RSET, NOOP
                        self.reply("250 ok")

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, count: int = 1, timeout: float = 60) -> list[Message]:
        return _wait(lambda: self.messages if len(self.messages) >= count else None, timeout, "mail")

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class WebhookSink:
    """An HTTP endpoint keeping each JSON body POSTed to it; answers `status`."""

    def __init__(self, status: int = 204):
        self.bodies: list[dict] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                sink.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, count: int = 1, timeout: float = 60) -> list[dict]:
        return _wait(lambda: self.bodies if len(self.bodies) >= count else None, timeout, "webhook calls")

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _wait(found, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := found()) is not None:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
