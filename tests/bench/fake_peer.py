"""A stand-in OpenAI server for `bench serve`'s failure handling (stdlib only, run as a script).

python fake_peer.py PORT MODE [N]
  refuse: print a refusal to stderr and exit 3 before listening (a peer that will not start);
  die:    serve N completions, then exit 5 on the next one, mid-stream (a peer that crashes under load);
  ok:     stream max_tokens one-token chunks per completion (TOKEN_S apart), with a running-requests gauge
          on /metrics.
With FAKE_PEER_BODIES=PATH in its environment, each request's body is appended to PATH (a JSON line).
"""

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, MODE = int(sys.argv[1]), sys.argv[2]
LIMIT = int(sys.argv[3]) if len(sys.argv) > 3 else 0
BODIES = os.environ.get("FAKE_PEER_BODIES")
# tokens paced as a server's are: a load that ended within a millisecond left bench serve's /metrics
# watcher no reading to take (its "most running" None) on a busy machine
TOKEN_S = 0.02
state = {"served": 0, "running": 0}
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the end of a stream is the end of its connection

    def log_message(self, *args):
        pass

    def reply(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self.reply(json.dumps({"data": [{"id": "bench"}]}).encode(), "application/json")
        elif self.path == "/metrics" and MODE == "ok":
            self.reply(f'vllm:num_requests_running{{model_name="bench"}} {state["running"]}.0\n'.encode(), "text/plain")
        else:
            self.send_error(404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with lock:
            if BODIES:
                with open(BODIES, "a") as f:
                    f.write(json.dumps(body) + "\n")
            state["served"] += 1
            state["running"] += 1
            dying = MODE == "die" and state["served"] > LIMIT
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b'data: {"choices": [{"index": 0, "text": "a"}]}\n\n')
        self.wfile.flush()
        if dying:
            sys.stderr.write("fake peer: engine core died (simulated)\n")
            sys.stderr.flush()
            os._exit(5)
        for _ in range(body["max_tokens"] - 1):
            time.sleep(TOKEN_S)
            self.wfile.write(b'data: {"choices": [{"index": 0, "text": "a"}]}\n\n')
            self.wfile.flush()
        usage = {"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        with lock:
            state["running"] -= 1


if MODE == "refuse":
    sys.stderr.write("ValueError: expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8 (simulated)\n")
    sys.exit(3)
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
