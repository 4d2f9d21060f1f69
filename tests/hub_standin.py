"""A stand-in for the endpoints of the Hugging Face Hub API that `HfApi.create_repo` and
`HfApi.upload_folder` call, served on loopback: repo creation, the check of a README.md's YAML
metadata (accepted; peft writes one beside an adapter), the pre-upload check (every file is sent
inline, "regular"), and the commit (NDJSON with each file base64-encoded). It keeps the files a
commit carries, so a test can compare them with what was uploaded."""
import base64, json, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Hub:
    def __init__(self):
        self.repos, self.files, self.calls = set(), {}, []
        hub = self
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a): pass
            def _body(self):
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""
            def _send(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code); self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
            def do_GET(self):
                hub.calls.append(("GET", self.path)); self._send(404, {"error": "not found"})
            def do_HEAD(self):
                hub.calls.append(("HEAD", self.path)); self.send_response(404); self.end_headers()
            def do_POST(self):
                body = self._body(); hub.calls.append(("POST", self.path))
                if self.path == "/api/repos/create":
                    req = json.loads(body); rid = f"{req.get('organization') or 'user'}/{req['name']}"
                    hub.repos.add(rid); return self._send(200, {"url": f"{hub.url}/{rid}", "name": rid})
                if self.path == "/api/validate-yaml":
                    return self._send(200, {"errors": [], "warnings": []})
                if "/preupload/" in self.path:
                    req = json.loads(body)
                    return self._send(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in req["files"]]})
                if "/commit/" in self.path:
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item["key"] == "file":
                            hub.files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                    return self._send(200, {"commitUrl": f"{hub.url}/{self.path.split('/')[3]}/{self.path.split('/')[4]}/commit/" + "0" * 40, "commitOid": "0" * 40, "success": True})
                self._send(404, {"error": self.path})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
