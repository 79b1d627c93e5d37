"""A recording proxy between an agent program and a server: every request is forwarded as it came (streamed
replies passed through as they arrive) and the generation requests are kept, in order, for
`scripts/agent_replay.py` to send again. Used by `scripts/agent_programs.py --record FILE`; on its own it
records any client pointed at it until interrupted:

    python scripts/agent_recorder.py --upstream http://127.0.0.1:8775 --port 8776 --out session.json
"""

from __future__ import annotations

import argparse
import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
HOP_BY_HOP = {"connection", "transfer-encoding", "content-length", "keep-alive"}


class RecordingProxy:
    """Listens on 127.0.0.1:`port`, forwards to `upstream` (http://HOST:PORT), records generation requests."""

    def __init__(self, upstream: str, port: int):
        self.upstream, self.requests, self.lock = upstream.rstrip("/"), [], threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "RecordingProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.requests, indent=1))

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                route = self.path.split("?")[0]
                if self.command == "POST" and route in GENERATION_ROUTES:
                    with proxy.lock:
                        proxy.requests.append({"route": route, "body": json.loads(body or b"null")})
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}}
                upstream = urllib.request.Request(proxy.upstream + self.path, data=body or None, headers=headers,
                                                  method=self.command)
                try:
                    reply = urllib.request.urlopen(upstream, timeout=3600)
                except urllib.error.HTTPError as error:
                    reply = error
                self.send_response(reply.status)
                for key, value in reply.headers.items():
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("Connection", "close")
                self.end_headers()
                while chunk := reply.read1(65536) if hasattr(reply, "read1") else reply.read():
                    self.wfile.write(chunk)
                    self.wfile.flush()

            do_GET = do_POST = do_DELETE = _forward

            def log_message(self, *args):
                pass

        return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="the server's base URL (http://HOST:PORT)")
    parser.add_argument("--port", type=int, default=8776, help="where clients connect instead")
    parser.add_argument("--out", type=Path, required=True, help="the session file written on Ctrl-C")
    args = parser.parse_args()
    with RecordingProxy(args.upstream, args.port) as proxy:
        print(f"recording on http://127.0.0.1:{args.port} (Ctrl-C to save {args.out})", flush=True)
        try:
            proxy.thread.join()
        except KeyboardInterrupt:
            pass
    proxy.save(args.out)
    print(f"{len(proxy.requests)} requests saved in {args.out}")


if __name__ == "__main__":
    main()
