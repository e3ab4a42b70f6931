"""A scripted stand-in for the Anthropic Messages API, for a real agent CLI under test.

Usage: standin.py ADDR PORT LOG CERT KEY  (HTTPS, HTTP/1.1). Every request is logged as one
JSON line (path, the x-api-key and authorization it carried, its accept-encoding, the first
tools offered). POST /v1/messages answers, streamed (SSE) or not, with a script: a tool call
that writes hello.txt, then one that runs the project's tests (and saves what the agent's
environment holds), then a final text. A request that offers no Write tool (a side request:
a title, a quota check) gets "ok".
"""
import json, ssl, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = open(sys.argv[3], "a", buffering=1)


def sse(events):
    out = []
    for name, data in events:
        out.append(f"event: {name}\ndata: {json.dumps(data)}\n\n")
    return "".join(out).encode()


def message(blocks, stop):
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
           "content": [], "stop_reason": None, "stop_sequence": None,
           "usage": {"input_tokens": 10, "output_tokens": 1}}
    ev = [("message_start", {"type": "message_start", "message": msg})]
    for i, b in enumerate(blocks):
        if b["type"] == "text":
            ev.append(("content_block_start", {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}))
            ev.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": b["text"]}}))
        else:
            ev.append(("content_block_start", {"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}}))
            ev.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": json.dumps(b["input"])}}))
        ev.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    ev.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 5}}))
    ev.append(("message_stop", {"type": "message_stop"}))
    return ev


def plan(body):
    msgs = body.get("messages", [])
    results = sum(1 for m in msgs if isinstance(m.get("content"), list)
                  for c in m["content"] if isinstance(c, dict) and c.get("type") == "tool_result")
    tools = [t.get("name") for t in body.get("tools", [])]
    if "Write" not in tools:
        return [{"type": "text", "text": "ok"}], "end_turn"
    if results == 0:
        return [{"type": "tool_use", "id": "toolu_1", "name": "Write",
                 "input": {"file_path": "/workspace/hello.txt", "content": "hello from the agent\n"}}], "tool_use"
    if results == 1:
        return [{"type": "tool_use", "id": "toolu_2", "name": "Bash",
                 "input": {"command": "sh test.sh > test-result.txt 2>&1; env > agent-env.txt; cat test-result.txt", "description": "run the tests"}}], "tool_use"
    return [{"type": "text", "text": "All done: hello.txt written and the tests ran."}], "end_turn"


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        n = int(self.headers.get("content-length", 0))
        raw = self.rfile.read(n)
        try:
            body = json.loads(raw)
        except Exception:
            body = {}
        LOG.write(json.dumps({"path": self.path, "key": self.headers.get("x-api-key"),
                              "auth": self.headers.get("authorization"),
                              "ae": self.headers.get("accept-encoding"),
                              "tools": [t.get("name") for t in body.get("tools", [])][:5],
                              "stream": body.get("stream")}) + "\n")
        if not self.path.startswith("/v1/messages"):
            self.send_response(404)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        blocks, stop = plan(body)
        if body.get("stream"):
            data = sse(message(blocks, stop))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            content = []
            for b in blocks:
                content.append(b if b["type"] == "text" else {"type": "tool_use", "id": b["id"], "name": b["name"], "input": b["input"]})
            data = json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                               "content": content, "stop_reason": stop, "stop_sequence": None,
                               "usage": {"input_tokens": 10, "output_tokens": 5}}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    def do_GET(self):
        LOG.write(json.dumps({"get": self.path}) + "\n")
        self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()

    do_HEAD = do_GET


addr, port = sys.argv[1], int(sys.argv[2])
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[4], sys.argv[5])
srv = ThreadingHTTPServer((addr, port), H)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
srv.serve_forever()
