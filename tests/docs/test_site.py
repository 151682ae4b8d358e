"""The docs site builds with every warning an error (mkdocs.yml: strict), its pages render in a
real headless browser (Chromium), every internal link and anchor resolves, and its search index
answers for the names a user looks up."""

import functools
import html.parser
import http.server
import json
import pathlib
import shutil
import subprocess
import sys
import threading
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytest.importorskip("mkdocs", reason="the docs tools: pip install -e '.[docs]'")
pytest.importorskip("mkdocstrings", reason="the docs tools: pip install -e '.[docs]'")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env={**__import__("os").environ,
                                                                          "NO_MKDOCS_2_WARNING": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


class Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.hrefs.append(a["href"])


def parsed(path: pathlib.Path) -> Links:
    p = Links()
    p.feed(path.read_text(errors="replace"))
    return p


def test_every_internal_link_and_anchor_resolves(site):
    pages = {p: parsed(p) for p in site.rglob("*.html")}
    assert len(pages) > 15
    bad = []
    for page, links in pages.items():
        for href in links.hrefs:
            url = urllib.parse.urlparse(href)
            if url.scheme or url.netloc or href.startswith(("mailto:", "javascript:")):
                continue
            path = urllib.parse.unquote(url.path)
            base = site if path.startswith("/") else page.parent   # (the 404 page links from the site's root)
            target = (base / path.lstrip("/")).resolve() if path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                bad.append(f"{page.relative_to(site)}: {href} (no such file)")
            elif url.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else parsed(target).ids
                if url.fragment not in ids:
                    bad.append(f"{page.relative_to(site)}: {href} (no such anchor)")
    assert not bad, "\n".join(bad[:50])


def test_the_search_index_answers_for_what_users_look_up(site):
    index = json.loads((site / "search" / "search_index.json").read_text())
    docs = index["docs"]
    for term, where in (("ExperienceBuffer", "api/"), ("update_priorities", "api/"), ("register_codec", "api/"),
                        ("conformance", "guides/"), ("staleness", "concepts/")):
        hits = [d["location"] for d in docs if term in d.get("text", "") or term in d.get("title", "")]
        assert any(h.startswith(where) for h in hits), (term, hits[:10])


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(chromium() is None, reason="needs Chromium (apt-get install chromium; .ci/run installs it)")
def test_the_pages_render_in_a_headless_browser(site):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))

    class Quiet(handler.func):
        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        for path, want in (("", "Experience Data Plane"), ("quickstart/", "ExperienceDataPlane"),
                           ("api/core/", "ExperienceBuffer"), ("guides/rllib/", "enable"),
                           ("benchmarks/", "exposed")):
            r = subprocess.run([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                "--user-data-dir=" + str(site.parent / "chromium-profile"),
                                "--virtual-time-budget=3000", "--dump-dom", base + path],
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr[-2000:]
            dom = r.stdout
            assert want in dom and "md-content" in dom, (path, dom[:500])   # rendered by the theme, with its content
            assert "404 - Not found" not in dom
    finally:
        server.shutdown()
        thread.join(timeout=10)
