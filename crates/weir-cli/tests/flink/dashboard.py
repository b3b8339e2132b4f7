"""Apache Flink's Web Dashboard in front of a weir REST API, as a Flink user would put it.

Serves the dashboard's files straight from Flink's distribution jar (its `web/` entries)
and passes every other request to weir's REST API, the way Flink's own JobManager serves
both from one port. Usage: dashboard.py FLINK_DIST_JAR WEIR_REST_URL PORT
"""
import http.server
import mimetypes
import sys
import urllib.error
import urllib.request
import zipfile

JAR, REST, PORT = sys.argv[1], sys.argv[2].rstrip("/"), int(sys.argv[3])
WEB = {name[len("web/"):]: name for name in zipfile.ZipFile(JAR).namelist() if name.startswith("web/") and not name.endswith("/")}


class Dashboard(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, content_type, body):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?")[0].lstrip("/") or "index.html"
        if path in WEB:
            with zipfile.ZipFile(JAR) as jar:
                body = jar.read(WEB[path])
            return self.answer(200, mimetypes.guess_type(path)[0] or "application/octet-stream", body)
        try:
            with urllib.request.urlopen(REST + self.path, timeout=10) as response:
                self.answer(response.status, response.headers.get("Content-Type", "application/json"), response.read())
        except urllib.error.HTTPError as error:
            self.answer(error.code, "application/json", error.read())
        except (urllib.error.URLError, OSError) as error:
            # weir did not answer: say so, as Flink's JobManager would, instead of hanging up.
            self.answer(502, "application/json", ('{"errors": ["%s"]}' % str(error).replace('"', "'")).encode())


print(f"dashboard at http://127.0.0.1:{PORT}", flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Dashboard).serve_forever()
