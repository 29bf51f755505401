"""A stand-in for the Hugging Face Hub on 127.0.0.1, over real HTTP, for huggingface_hub pointed at
it with HF_ENDPOINT. It answers the calls huggingface_hub 2.4 makes to find and fetch a model's files:

    GET  /api/models/{repo}[/revision/{rev}]?blobs=true   model info: sha, siblings with size, blobId, lfs
    HEAD /{repo}/resolve/{rev}/{path}                     X-Repo-Commit, ETag (sha256 of LFS files,
                                                          git blob sha1 of the others), X-Linked-Etag,
                                                          X-Linked-Size, Content-Length
    GET  /{repo}/resolve/{rev}/{path}                     the bytes, a Range "bytes=N-" as 206

errors as the Hub spells them (404 with X-Error-Code RepoNotFound / RevisionNotFound / EntryNotFound).
No Xet headers: every download is plain HTTP. Faults for the tests: a file served corrupt (one byte
flipped, same size), or stalled after some bytes until released.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    def __init__(self):
        self.repos: dict[str, dict] = {}      # repo -> {"refs": {name: commit}, "commits": {commit: {path: bytes}}}
        self.requests: list[tuple[str, str, str | None, str | None]] = []   # method, path, Range, Authorization
        self.corrupt: set[str] = set()        # file paths served with one byte flipped
        self.stall: dict[str, tuple[int, threading.Event]] = {}   # path -> (bytes sent, then wait for the event)
        self.served: dict[str, int] = {}      # path -> body bytes sent
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # ---- content ----------------------------------------------------------------------------

    def add_repo(self, repo_id: str, files: dict[str, bytes | Path], revision: str = "main") -> str:
        """Publish files as a new commit of repo_id on branch `revision`; returns the commit."""
        data = {p: (v.read_bytes() if isinstance(v, Path) else v) for p, v in files.items()}
        h = hashlib.sha1(repo_id.encode() + revision.encode())
        for p in sorted(data):
            h.update(p.encode() + hashlib.sha256(data[p]).digest())
        commit = h.hexdigest()
        repo = self.repos.setdefault(repo_id, {"refs": {}, "commits": {}})
        repo["refs"][revision] = commit
        repo["commits"][commit] = data
        return commit

    def _commit(self, repo_id: str, rev: str) -> tuple[str | None, str | None]:
        """(commit, error code) of repo_id at rev."""
        repo = self.repos.get(repo_id)
        if repo is None:
            return None, "RepoNotFound"
        if rev in repo["refs"]:
            return repo["refs"][rev], None
        if rev in repo["commits"]:
            return rev, None
        return None, "RevisionNotFound"

    @staticmethod
    def sibling(path: str, data: bytes) -> dict:
        out = {"rfilename": path, "size": len(data), "blobId": git_blob_sha1(data)}
        if path.endswith(LFS_SUFFIXES):
            out["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return out

    # ---- serving ---------------------------------------------------------------------------

    def start(self) -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _error(self, status: int, code: str, commit: str | None = None):
                body = json.dumps({"error": code}).encode()
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                if commit:
                    self.send_header("X-Repo-Commit", commit)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_HEAD(self):
                self._route()

            def do_GET(self):
                self._route()

            def _route(self):
                url = urlsplit(self.path)
                with hub.lock:
                    hub.requests.append((self.command, url.path, self.headers.get("Range"),
                                         self.headers.get("Authorization")))
                m = re.match(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$", url.path)
                if m and self.command == "GET":
                    return self._info(unquote(m.group(1)), unquote(m.group(2) or "main"))
                m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", url.path)
                if m:
                    return self._file(unquote(m.group(1)), unquote(m.group(2)), unquote(m.group(3)))
                self._error(404, "NotFound")

            def _info(self, repo_id: str, rev: str):
                commit, err = hub._commit(repo_id, rev)
                if err:
                    return self._error(404, err)
                files = hub.repos[repo_id]["commits"][commit]
                body = json.dumps({"id": repo_id, "modelId": repo_id, "sha": commit, "private": False,
                                   "siblings": [hub.sibling(p, d) for p, d in sorted(files.items())]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _file(self, repo_id: str, rev: str, path: str):
                commit, err = hub._commit(repo_id, rev)
                if err:
                    return self._error(404, err)
                files = hub.repos[repo_id]["commits"][commit]
                if path not in files:
                    return self._error(404, "EntryNotFound", commit)
                data = files[path]
                sib = hub.sibling(path, data)
                if path in hub.corrupt:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                start = 0
                rng = self.headers.get("Range")
                if rng and self.command == "GET":
                    start = int(re.match(r"bytes=(\d+)-", rng).group(1))
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", commit)
                self.send_header("Accept-Ranges", "bytes")
                if "lfs" in sib:
                    self.send_header("ETag", f'"{sib["lfs"]["sha256"]}"')
                    self.send_header("X-Linked-Etag", f'"{sib["lfs"]["sha256"]}"')
                    self.send_header("X-Linked-Size", str(len(data)))
                else:
                    self.send_header("ETag", f'"{sib["blobId"]}"')
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if self.command == "HEAD":
                    return
                body = data[start:]
                stall = hub.stall.get(path)
                if stall is not None:
                    first, release = stall
                    self.wfile.write(body[:first])
                    self.wfile.flush()
                    self._count(path, first)
                    release.wait(60)
                    self.close_connection = True
                    return      # the rest never comes: the client sees a cut transfer
                self.wfile.write(body)
                self._count(path, len(body))

            def _count(self, path: str, n: int):
                with hub.lock:
                    hub.served[path] = hub.served.get(path, 0) + n

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        for _, release in self.stall.values():
            release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def gets(self, path_suffix: str = "") -> list[tuple[str, str, str | None, str | None]]:
        """The GETs of files (not the API) whose path ends with path_suffix."""
        with self.lock:
            return [r for r in self.requests if r[0] == "GET" and "/resolve/" in r[1] and r[1].endswith(path_suffix)]
