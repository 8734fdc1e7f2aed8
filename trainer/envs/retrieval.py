"""Retrievers for the search environment, one interface: `search(queries, k)` -> per query its
top-k passages {id, title, text}, best first (an empty list when nothing matches).

- BM25 (`bm25s`, CPU, the default): built from a jsonl corpus once and cached beside it.
- Dense (`e5:DIR`): an E5-style encoder through transformers (mean pooling, L2-normalised,
  "query: " / "passage: " prefixes, as the paper's code and Search-R1 use e5-base-v2) over a
  FAISS inner-product index; DIR is built by `dense-index` below or points at a prebuilt index.
- Remote (`http://host:port`): a retrieval service several trainers share, as Search-R1 runs one.
  `serve` below is a small one (standard library HTTP, one retriever behind a lock); the client
  also reads Search-R1's own server's replies ({"document": {"contents": '"title"\\ntext'}}).

    python -m freshper.trainer.envs.retrieval serve --corpus wiki.jsonl [--retriever e5:DIR] --port 8100
    python -m freshper.trainer.envs.retrieval dense-index --corpus wiki.jsonl --encoder E5_DIR --out DIR
"""
from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

MAX_QUERY_CHARS = 300  # a longer query is cut before retrieval (defined behaviour, not an error)


def read_corpus(path) -> list[dict]:
    """Passages {id, title, text} from a jsonl file; ValueError naming the file and line."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"env.corpus: {path} is not a file (a jsonl of {{id, title, text}} passages)")
    out = []
    with p.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"env.corpus: {path} line {n} is not JSON ({e.msg})") from None
            if not isinstance(row, dict) or "text" not in row:
                raise ValueError(f"env.corpus: {path} line {n} needs a 'text' field (and 'id', 'title')")
            out.append({"id": str(row.get("id", n)), "title": str(row.get("title", "")), "text": str(row["text"])})
    if not out:
        raise ValueError(f"env.corpus: {path} holds no passages")
    return out


class Retriever:
    """BM25 (bm25s) over passages; `search(queries, k)` -> per query the top-k passages."""

    def __init__(self, passages: list[dict], index_dir: Path | None = None):
        import bm25s

        if not passages:
            raise ValueError("the corpus holds no passages")
        self.passages = passages
        texts = [f"{p['title']} {p['text']}" for p in passages]
        if index_dir is not None and (index_dir / "params.index.json").exists():
            self.bm25 = bm25s.BM25.load(str(index_dir))
        else:
            self.bm25 = bm25s.BM25()
            self.bm25.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
            if index_dir is not None:
                self.bm25.save(str(index_dir))

    @classmethod
    def from_jsonl(cls, path) -> "Retriever":
        """The index is cached beside the corpus, keyed by the file's size and modification time."""
        p = Path(path).expanduser()
        passages = read_corpus(p)
        stat = p.stat()
        key = hashlib.sha1(f"{stat.st_size}-{stat.st_mtime_ns}".encode()).hexdigest()[:10]
        return cls(passages, p.with_name(f"{p.name}.bm25s-{key}"))

    def search(self, queries: list[str], k: int = 3) -> list[list[dict]]:
        import bm25s

        k = min(k, len(self.passages))
        qs = [q[:MAX_QUERY_CHARS] for q in queries]
        tokens = bm25s.tokenize(qs, stopwords="en", show_progress=False)
        # nothing searchable (stop words only): no results, as an empty search engine answers
        rows = [i for i, q in enumerate(tokens.ids) if q]
        out = [[] for _ in qs]
        if rows:  # one retrieval call for the whole batch
            batch = bm25s.tokenization.Tokenized(ids=[tokens.ids[i] for i in rows], vocab=tokens.vocab)
            docs, scores = self.bm25.retrieve(batch, k=k, show_progress=False)
            for j, i in enumerate(rows):
                out[i] = [{**self.passages[int(d)], "score": float(s)} for d, s in zip(docs[j], scores[j]) if s > 0]
        return out


# ------------------------------------------------------------------------------------ dense
class Encoder:
    """E5-style sentence embeddings: mean of the last hidden states over the attention mask,
    L2-normalised, (n, H) float32 numpy."""

    def __init__(self, path: str, max_length: int = 256, device: str | None = None):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).to(self.device).eval()
        self.max_length = max_length

    def __call__(self, texts: list[str], batch: int = 256):
        import numpy as np
        import torch

        out = []
        with torch.no_grad():
            for s in range(0, len(texts), batch):
                enc = self.tok(texts[s:s + batch], padding=True, truncation=True, max_length=self.max_length,
                               return_tensors="pt").to(self.device)
                h = self.model(**enc).last_hidden_state.float()
                m = enc["attention_mask"][..., None].float()
                v = (h * m).sum(1) / m.sum(1).clamp_min(1.0)
                out.append(torch.nn.functional.normalize(v, dim=-1).cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.model.config.hidden_size), dtype=np.float32)


def build_dense_index(corpus: str, encoder: str, out: str, batch: int = 256, max_length: int = 256) -> Path:
    """Encode every passage ("passage: title text") into a FAISS inner-product index in `out`
    (index.faiss, meta.json naming the corpus and encoder). Returns the folder."""
    import faiss

    passages = read_corpus(corpus)
    enc = Encoder(encoder, max_length)
    vecs = enc([f"passage: {p['title']} {p['text']}" for p in passages], batch)
    index = faiss.IndexFlatIP(vecs.shape[1])
    index.add(vecs)
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    faiss.write_index(index, str(d / "index.faiss"))
    (d / "meta.json").write_text(json.dumps({"corpus": str(Path(corpus).resolve()), "encoder": encoder,
                                             "index": "index.faiss", "max_length": max_length}, indent=1))
    return d


class DenseRetriever:
    """FAISS over E5-style embeddings, from a folder with meta.json {corpus, encoder, index}
    (`index` may be a prebuilt file elsewhere, e.g. Search-R1's e5_Flat.index with its corpus)."""

    def __init__(self, folder: str):
        import faiss

        d = Path(folder).expanduser()
        if not (d / "meta.json").is_file():
            raise ValueError(f"env.retriever e5:{folder}: no meta.json there (build one with "
                             f"python -m freshper.trainer.envs.retrieval dense-index)")
        meta = json.loads((d / "meta.json").read_text())
        self.passages = read_corpus(meta["corpus"])
        self.index = faiss.read_index(str(d / meta["index"]))
        if self.index.ntotal != len(self.passages):
            raise ValueError(f"env.retriever e5:{folder}: the index holds {self.index.ntotal} vectors but the corpus "
                             f"{len(self.passages)} passages")
        self.encode = Encoder(meta["encoder"], meta.get("max_length", 256))

    def search(self, queries: list[str], k: int = 3) -> list[list[dict]]:
        k = min(k, len(self.passages))
        if not queries:
            return []
        scores, ids = self.index.search(self.encode([f"query: {q[:MAX_QUERY_CHARS]}" for q in queries]), k)
        return [[{**self.passages[int(i)], "score": float(s)} for i, s in zip(row, srow) if i >= 0]
                for row, srow in zip(ids, scores)]


# ----------------------------------------------------------------------------------- remote
class RemoteRetriever:
    """A retrieval service over HTTP: POST {url}/retrieve {"queries", "topk"} -> {"result"}.

    A request that fails (no connection, a timeout of `timeout_s` seconds, a 5xx answer) is tried
    again `retries` times, waiting backoff_s, 2 backoff_s, 4 backoff_s, ... in between: one hiccup
    of the service must not end a run that took hours of GPU time. After the last try, a
    RuntimeError naming the service and the last error. A 4xx answer is the request's fault and
    is not retried."""

    passages: list[dict] = []

    def __init__(self, url: str, timeout_s: float = 60.0, retries: int = 4, backoff_s: float = 1.0):
        if retries < 0 or backoff_s < 0 or timeout_s <= 0:
            raise ValueError(f"RemoteRetriever needs timeout_s > 0, retries >= 0, backoff_s >= 0; got {timeout_s}, "
                             f"{retries}, {backoff_s}")
        self.url, self.timeout_s, self.retries, self.backoff_s = url.rstrip("/"), timeout_s, retries, backoff_s

    def search(self, queries: list[str], k: int = 3) -> list[list[dict]]:
        import time
        import urllib.error
        import urllib.request

        body = json.dumps({"queries": [q[:MAX_QUERY_CHARS] for q in queries], "topk": k}).encode()
        last = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            req = urllib.request.Request(f"{self.url}/retrieve", body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                    result = json.loads(r.read())["result"]
                return [[_passage(item) for item in row] for row in result]
            except urllib.error.HTTPError as e:
                if e.code < 500:
                    raise RuntimeError(f"retrieval service {self.url} refused the request: {e}") from e
                last = e
            except (OSError, ValueError) as e:  # connection, timeout, a broken answer
                last = e
        raise RuntimeError(f"retrieval service {self.url} did not answer after {self.retries + 1} tries: "
                           f"{last}") from last


def _passage(item: dict) -> dict:
    """Our service's passages as they are; Search-R1's {"document": {"id", "contents"}} with
    contents '"Title"\\ntext' split back into title and text."""
    if "document" not in item:
        return item
    doc = item["document"]
    title, _, text = doc.get("contents", "").partition("\n")
    out = {"id": str(doc.get("id", "")), "title": title.strip('"'), "text": text}
    if "score" in item:
        out["score"] = float(item["score"])
    return out


def serve(retriever, host: str = "127.0.0.1", port: int = 8100):
    """An HTTP server answering POST /retrieve with `retriever` (one search at a time); returns
    the server (call serve_forever, or shutdown)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                queries, k = req["queries"], int(req.get("topk", 3))
                if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries) or k < 1:
                    raise ValueError("queries must be a list of strings and topk >= 1")
                with lock:
                    body, code = json.dumps({"result": retriever.search(queries, k)}).encode(), 200
            except (ValueError, KeyError, TypeError) as e:
                body, code = json.dumps({"error": str(e)}).encode(), 400
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # quiet: one line per request would flood a training log
            pass

    return ThreadingHTTPServer((host, port), Handler)


def make_retriever(spec: str, corpus: str, passages: list[dict] | None = None):
    """'bm25' over `corpus` (or the given passages), 'e5:DIR', or an http(s) URL."""
    if spec == "bm25":
        return Retriever.from_jsonl(corpus) if corpus else Retriever(passages or [])
    if spec.startswith("e5:"):
        return DenseRetriever(spec[3:])
    if spec.startswith(("http://", "https://")):
        return RemoteRetriever(spec)
    raise ValueError(f"env.retriever must be 'bm25', 'e5:DIR' or an http(s) URL, got {spec!r}")


def main(argv=None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m freshper.trainer.envs.retrieval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="a retrieval service over HTTP")
    s.add_argument("--corpus", required=True)
    s.add_argument("--retriever", default="bm25", help="bm25 | e5:DIR")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8100)
    d = sub.add_parser("dense-index", help="encode a corpus into a FAISS index")
    d.add_argument("--corpus", required=True)
    d.add_argument("--encoder", required=True, help="a local E5-style model folder (e.g. intfloat/e5-base-v2)")
    d.add_argument("--out", required=True)
    d.add_argument("--batch", type=int, default=256)
    a = p.parse_args(argv)
    if a.cmd == "dense-index":
        print(build_dense_index(a.corpus, a.encoder, a.out, a.batch))
        return
    server = serve(make_retriever(a.retriever, a.corpus), a.host, a.port)
    print(f"retrieval service on http://{a.host}:{server.server_address[1]}/retrieve", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
