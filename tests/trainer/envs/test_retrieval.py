"""The search environment's retrievers beyond BM25: the dense one (FAISS over an E5-style encoder,
here a tiny random BERT with a tokenizer trained offline) and the HTTP service with its client."""
import json
import threading

import numpy as np
import pytest

from freshper.trainer.envs import retrieval as R
from freshper.trainer.envs.search import Search, generated_kb


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    d = tmp_path_factory.mktemp("kb")
    passages, train, _ = generated_kb(0)
    (d / "corpus.jsonl").write_text("\n".join(json.dumps(p) for p in passages) + "\n")
    return d, passages, train


@pytest.fixture(scope="module")
def encoder_dir(kb):
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertConfig, BertModel, BertTokenizerFast

    d, passages, _ = kb
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator([f"{p['title']} {p['text']}" for p in passages] + ["query: passage:"],
                            trainers.WordPieceTrainer(vocab_size=600, special_tokens=["[PAD]", "[UNK]", "[CLS]",
                                                                                      "[SEP]", "[MASK]"]))
    fast = BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                             sep_token="[SEP]", mask_token="[MASK]")
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=fast.vocab_size, hidden_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=64, max_position_embeddings=128))
    out = d / "encoder"
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return str(out)


def test_dense_retrieval_equals_brute_force_cosine_over_the_same_encoder(kb, encoder_dir, tmp_path):
    d, passages, train = kb
    folder = R.build_dense_index(str(d / "corpus.jsonl"), encoder_dir, str(tmp_path / "dense"))
    r = R.make_retriever(f"e5:{folder}", "")
    assert isinstance(r, R.DenseRetriever) and len(r.passages) == len(passages)
    qs = [q for q, _ in train[:12]]
    got = r.search(qs, k=3)
    enc = R.Encoder(encoder_dir)
    p = enc([f"passage: {x['title']} {x['text']}" for x in passages])
    q = enc([f"query: {x}" for x in qs])
    top = np.argsort(-(q @ p.T), axis=1, kind="stable")[:, :3]
    for row, want in zip(got, top):
        assert [x["id"] for x in row] == [passages[i]["id"] for i in want]
    assert np.allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-5), "E5 embeddings are L2-normalised"


def test_a_dense_folder_that_does_not_match_its_corpus_is_named(kb, encoder_dir, tmp_path):
    d, passages, _ = kb
    folder = R.build_dense_index(str(d / "corpus.jsonl"), encoder_dir, str(tmp_path / "dense"))
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(json.dumps(x) for x in passages[:5]) + "\n")
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, "corpus": str(short)}))
    with pytest.raises(ValueError, match="holds .* vectors but the corpus 5 passages"):
        R.DenseRetriever(str(folder))
    with pytest.raises(ValueError, match="no meta.json"):
        R.DenseRetriever(str(tmp_path))
    with pytest.raises(ValueError, match="env.retriever must be"):
        R.make_retriever("tfidf", "")


@pytest.fixture()
def service(kb):
    _, passages, _ = kb
    local = R.Retriever(passages)
    server = R.serve(local, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield local, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_service_answers_what_the_retriever_behind_it_answers(kb, service):
    _, _, train = kb
    local, url = service
    qs = [q for q, _ in train[:10]] + ["the a an"]
    assert R.RemoteRetriever(url).search(qs, 3) == local.search(qs, 3)


def test_a_search_env_over_the_service_plays_an_episode(kb, service):
    url = service[1]
    env = Search(retriever=url)
    env.reset(3)
    r = env.step(f"<search>{env.question}</search>")
    assert r.observation.startswith("<information>\nDoc 1(Title:") and not r.done
    r = env.step(f"<answer>{env.golds[0]}</answer>")
    assert r.done and r.reward == 1.0
    assert env.random_reply(__import__("random").Random(0))  # no corpus here: still a well-formed reply


def test_a_bad_request_and_a_dead_service_are_errors_that_say_so(service):
    import urllib.error
    import urllib.request

    _, url = service
    req = urllib.request.Request(f"{url}/retrieve", b'{"queries": "not a list"}', {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 400 and "list of strings" in e.value.read().decode()
    with pytest.raises(RuntimeError, match="did not answer after 2 tries"):
        R.RemoteRetriever("http://127.0.0.1:9", timeout_s=2, retries=1, backoff_s=0).search(["x"], 3)


def test_a_service_that_fails_twice_is_retried_and_answers():
    """A loopback service answering 503 to its first two requests: retried, then its answer."""
    import json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    calls = []

    class Flaky(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            calls.append(1)
            ok = len(calls) > 2
            body = json.dumps({"result": [[{"id": "1", "title": "T", "text": "x"}]]}).encode() if ok else b"busy"
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        got = R.RemoteRetriever(url, retries=2, backoff_s=0.01).search(["x"], 1)
        assert got == [[{"id": "1", "title": "T", "text": "x"}]] and len(calls) == 3
        calls.clear()
        with pytest.raises(RuntimeError, match="after 2 tries"):
            R.RemoteRetriever(url, retries=1, backoff_s=0).search(["x"], 1)
    finally:
        server.shutdown()


def test_search_r1_service_replies_are_read_as_passages():
    item = {"document": {"id": "17", "contents": '"Zorvan Kel"\nZorvan Kel was born in Tarmish.'}, "score": 3.2}
    assert R._passage(item) == {"id": "17", "title": "Zorvan Kel", "text": "Zorvan Kel was born in Tarmish.",
                                "score": 3.2}
