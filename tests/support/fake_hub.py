"""A Hugging Face Hub in memory, behind huggingface_hub's HTTP client.

``serve(hub)`` installs an ``httpx2.MockTransport`` through ``huggingface_hub.set_client_factory``:
the library's own download (``hf_hub_download``) and upload (``create_repo``, preupload,
commit) code runs unchanged and only the network is replaced. The routes answer what the
Hub answers, as far as that code reads it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re

import httpx2
import huggingface_hub
from huggingface_hub.utils import _http

COMMIT = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)/(?P<action>preupload|commit)/(?P<rev>[^/]+)")
RESOLVE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)")


class FakeHub:
    def __init__(self):
        self.commits: dict[str, dict[str, dict[str, bytes]]] = {}   # repo -> commit sha -> path -> bytes
        self.main: dict[str, str] = {}                              # repo -> sha of main
        self.created: list[str] = []                                # repos created, in order
        self.requests: list[tuple[str, str]] = []                   # (method, path) of every request

    def add_commit(self, repo: str, files: dict[str, bytes]) -> str:
        """Make ``files`` the new head of ``repo``'s main; returns the commit sha."""
        sha = hashlib.sha1(json.dumps({p: hashlib.sha1(b).hexdigest() for p, b in sorted(files.items())})
                           .encode() + repo.encode()).hexdigest()
        self.commits.setdefault(repo, {})[sha] = dict(files)
        self.main[repo] = sha
        return sha

    def files(self, repo: str) -> dict[str, bytes]:
        return self.commits[repo][self.main[repo]]

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        self.requests.append((request.method, path))
        if path == "/api/repos/create":
            body = json.loads(request.content)
            repo = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
            self.created.append(repo)
            return httpx2.Response(200, json={"url": f"https://huggingface.co/{repo}"})
        if path == "/api/validate-yaml":
            return httpx2.Response(200, json={})
        if match := COMMIT.fullmatch(path):
            return self._commit(match["repo"], match["action"], request)
        if match := RESOLVE.fullmatch(path):
            return self._resolve(match["repo"], match["rev"], match["path"], request.method)
        return httpx2.Response(404, json={"error": f"no route {path}"})

    def _commit(self, repo: str, action: str, request: httpx2.Request) -> httpx2.Response:
        if action == "preupload":   # every file as a regular (inline, base64) file: no LFS round trip
            files = json.loads(request.content)["files"]
            return httpx2.Response(200, json={"files": [{"path": f["path"], "uploadMode": "regular",
                                                         "shouldIgnore": False} for f in files]})
        lines = [json.loads(line) for line in request.content.decode().splitlines() if line]
        base = dict(self.files(repo)) if repo in self.main else {}
        for line in lines:
            if line["key"] == "file":
                base[line["value"]["path"]] = base64.b64decode(line["value"]["content"])
        sha = self.add_commit(repo, base)
        return httpx2.Response(200, json={"commitUrl": f"https://huggingface.co/{repo}/commit/{sha}",
                                          "commitOid": sha, "pullRequestUrl": None})

    def _resolve(self, repo: str, rev: str, path: str, method: str) -> httpx2.Response:
        if repo not in self.main:
            return httpx2.Response(401, headers={"X-Error-Code": "RepoNotFound"}, json={"error": "no such repo"})
        sha = self.main[repo] if rev == "main" else rev
        files = self.commits[repo].get(sha)
        if files is None:
            return httpx2.Response(404, headers={"X-Error-Code": "RevisionNotFound"}, json={"error": "no revision"})
        if path not in files:
            return httpx2.Response(404, headers={"X-Error-Code": "EntryNotFound"}, json={"error": "no such file"})
        data = files[path]
        headers = {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                   "Content-Length": str(len(data))}
        return httpx2.Response(200, headers=headers, content=b"" if method == "HEAD" else data)


@contextlib.contextmanager
def serve(hub: FakeHub):
    """huggingface_hub talks to ``hub`` inside the block (and to nothing else), through a
    client configured like its default one (its request hook enforces HF_HUB_OFFLINE)."""
    with _transport(hub.handle):
        yield hub


@contextlib.contextmanager
def unreachable():
    """Inside the block every request of huggingface_hub fails as it does without a network
    (the name does not resolve); yields the list of the URLs it tried."""
    tried: list[str] = []

    def refuse(request: httpx2.Request) -> httpx2.Response:
        tried.append(str(request.url))
        raise httpx2.ConnectError("[Errno -2] Name or service not known", request=request)

    with _transport(refuse):
        yield tried


@contextlib.contextmanager
def _transport(handler):
    huggingface_hub.set_client_factory(lambda: httpx2.Client(
        transport=httpx2.MockTransport(handler), event_hooks={"request": [_http.hf_request_event_hook]},
        follow_redirects=True))
    try:
        yield
    finally:
        huggingface_hub.set_client_factory(_http.default_client_factory)
