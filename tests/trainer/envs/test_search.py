"""Search agents: answer checks, the BM25 retriever and its corpus errors, the episode rules, the
loss mask over retrieved passages, Search-R1 data, and a tiny training run."""
import json

import pytest
import torch

from freshper.trainer import config
from freshper.trainer.envs.search import (
    MAX_QUERY_CHARS,
    Retriever,
    Search,
    contains_match,
    exact_match,
    f1,
    format_results,
    generated_kb,
    read_corpus,
)
from freshper.trainer.study.chance import chance


@pytest.mark.parametrize("pred,golds,em,f", [
    ("The Eiffel Tower!", ["eiffel tower"], 1.0, 1.0),
    ("an apple", "Apple", 1.0, 1.0),
    ("Paris, France", ["paris", "France"], 0.0, 2 / 3),
    ("", ["x"], 0.0, 0.0),
    ("theater", ["the ater"], 0.0, 0.0),  # articles go as whole words only
    (None, ["none"], 1.0, 1.0),
    ("x", [], 0.0, 0.0),
    ("x", 5, 0.0, 0.0),
    (object(), ["x"], 0.0, 0.0),
    ("a", ["the"], 1.0, 0.0),  # both normalise to "": equal strings, but no shared token (SQuAD's F1 is 0)
])
def test_exact_match_and_f1(pred, golds, em, f):
    assert exact_match(pred, golds) == em
    assert f1(pred, golds) == pytest.approx(f, abs=1e-9)


@pytest.mark.parametrize("pred,golds,want", [
    ("Paris, France", ["Paris"], 1.0), ("Roosevelt", ["Theodore Roosevelt"], 1.0),
    ("a", ["Paris"], 1.0),  # a substring of "paris": their rule's, kept
    (".", ["Paris"], 0.0),  # empty after normalising: 0 here, 1 in the authors' code
    ("the Paris", ["Paris"], 1.0),  # "the" starts the string: kept by their normalisation, still contains
    ("Lyon", ["Paris"], 0.0),
])
def test_the_authors_containment_rule(pred, golds, want):
    assert contains_match(pred, golds) == want


def test_search_match_picks_the_rule_and_both_are_reported():
    for match, want in (("contains", 1.0), ("exact", 0.0)):
        env = Search(match=match)
        env.reset(3)
        r = env.step(f"<answer>{env.golds[0]} and more words</answer>")
        assert r.reward == want and env.metrics()["answer_contains"] == 1.0 and env.metrics()["answer_em"] == 0.0


def test_results_are_printed_as_the_authors_env_prints_them():
    found = [{"title": "A", "text": "one two three", "score": 2.5}, {"title": "B", "text": "four five"}]
    assert format_results(found) == ("<information>\nDoc 1(Title: A) one two three [Score: 2.5000]\n"
                                     "Doc 2(Title: B) four five\n</information>")
    assert format_results(found, words=2).splitlines()[1] == "Doc 1(Title: A) one two [Score: 2.5000]"


@pytest.mark.parametrize("reply,valid,done,searched", [
    ("<think>let me think</think>", True, False, False),  # thinking only: valid, the episode goes on
    ("<search></search>", False, False, False),  # an empty search is no action
    ("<answer>  </answer>", False, False, False),  # nor is an empty answer
    ("<think>x</think><answer> </answer>", True, False, False),  # ... though the thinking counts
    ("<answer>Paris</answer><search>q</search>", True, True, False),  # the answer wins over a search
    ("<search>q</search><answer>Paris</answer>", True, True, False),  # wherever it stands
])
def test_what_a_search_reply_may_be_as_the_authors_env_has_it(reply, valid, done, searched):
    env = Search()
    env.reset(1)
    r = env.step(reply)
    assert (r.valid, r.done, env.searches > 0) == (valid, done, searched)
    assert r.penalty == (0.0 if valid else env.format_penalty)
    if valid and not done:
        assert r.observation == "Continue with your reasoning..."


def test_f1_partial_credit():
    assert f1("capital Quelmont", ["Quelmont"]) == pytest.approx(2 / 3)
    assert f1("Quelmont", ["the Quelmont"]) == 1.0


def corpus_file(tmp_path, rows):
    p = tmp_path / "corpus.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return p


def test_retriever_finds_the_entity_and_caches_its_index(tmp_path):
    passages, train, _ = generated_kb(0)
    p = corpus_file(tmp_path, passages)
    r = Retriever.from_jsonl(p)
    q, gold = train[5]
    hits = r.search([q])[0]
    assert hits and any(gold in h["text"] for h in hits)
    assert len(list(tmp_path.glob("corpus.jsonl.bm25s-*"))) == 1, "the index is cached beside the corpus"
    again = Retriever.from_jsonl(p)
    assert [h["id"] for h in again.search([q])[0]] == [h["id"] for h in hits]
    assert r.search(["the a an"])[0] == [], "a query of stop words finds nothing, and says so"
    assert format_results([]) == "<information>\nNo results found.\n</information>"
    assert r.search(["x" * 10 * MAX_QUERY_CHARS])[0] is not None  # a very long query is cut, not an error


def test_a_batch_of_queries_finds_what_each_finds_alone(tmp_path):
    passages, train, _ = generated_kb(0)
    r = Retriever(passages)
    queries = [q for q, _ in train[:20]] + ["the a an", train[3][0]]
    batch = r.search(queries, k=3)
    alone = [r.search([q], k=3)[0] for q in queries]
    assert [[h["id"] for h in b] for b in batch] == [[h["id"] for h in a] for a in alone]
    assert batch[20] == [] and all(batch[i] for i in range(20))


@pytest.mark.parametrize("text,needle", [("", "holds no passages"), ("{bad json\n", "line 1 is not JSON"),
                                         ('{"id": 1, "title": "t"}\n', "line 1 needs a 'text' field")])
def test_malformed_corpora_are_named(tmp_path, text, needle):
    p = tmp_path / "c.jsonl"
    p.write_text(text)
    with pytest.raises(ValueError, match=needle):
        read_corpus(p)
    with pytest.raises(ValueError, match="is not a file"):
        read_corpus(tmp_path / "missing.jsonl")


def test_episode_rules():
    env = Search()
    env.reset(7)
    gold = env.golds[0]
    r = env.step("<think>look it up</think><search>" + env.question + "</search>")
    assert r.valid and not r.done and r.observation.startswith("<information>") and gold in r.observation
    r = env.step("<search>unclosed tag")
    assert not r.valid and r.penalty == env.format_penalty and not r.done
    r = env.step(f"<answer> the {gold.lower()} </answer>")
    assert r.done and r.success and r.reward == 1.0
    assert env.metrics() == {"searches": 1.0, "answer_f1": 1.0, "answer_em": 1.0, "answer_contains": 1.0,
                             "query_copied": 1.0, "answer_copied": 1.0}
    env.reset(7)
    env.step("<search>capital zzz</search>")
    env.step("<answer>qqq</answer>")
    assert env.metrics()["query_copied"] == 0.0 and env.metrics()["answer_copied"] == 0.0
    env = Search(max_searches=2)
    env.reset(7)
    for _ in range(2):
        assert not env.step("<search>x y</search>").done
    r = env.step("<search>x y</search>")
    assert r.done and r.reward == 0.0 and not r.success, "a search past the limit ends the episode unanswered"
    env = Search(max_turns=2)
    env.reset(1)
    env.step("no tags")
    assert env.step("still none").done


def test_random_replies_copy_the_question_into_searches_and_the_passages_into_answers():
    """The format warm start's replies: random choices, words from the episode. The first reply
    searches a span of the question; answers are words of the last results; past the search
    limit only answers come."""
    import random

    env = Search(max_searches=2)
    rng = random.Random(0)
    answers = spans = 0
    for seed in range(60):
        env.reset(seed)
        q = [w.strip("?") for w in env.question.split()]
        first = env.random_reply(rng)
        assert first.startswith("<search>") and " ".join(q).find(first[8:-9]) >= 0
        spans += 1
        r = env.step(first)
        while not env.done:
            reply = env.random_reply(rng)
            if reply.startswith("<answer>"):
                word = reply[8:-9]
                assert word in (env.seen or q), (word, env.seen[:10])  # the question's if nothing came back
                answers += 1
            else:
                assert env.searches < env.max_searches
            r = env.step(reply)
        assert r.done
    assert answers == 60 and spans == 60


def test_validation_asks_about_entities_training_never_asks_about():
    env = Search()
    train_q = {env.reset(s) for s in range(300)}
    eval_q = {env.reset(2**31 + s) for s in range(60)}
    assert not train_q & eval_q
    ent = lambda q: q.rstrip("?").split()[-1]  # noqa: E731
    assert not {ent(q) for q in train_q} & {ent(q) for q in eval_q}


def test_search_r1_data_and_corpus(tmp_path):
    import pandas as pd

    passages = [{"id": "1", "title": "Zorv", "text": "Zorv's capital is Quel."},
                {"id": "2", "title": "Mab", "text": "Mab's capital is Dorn."}]
    corpus = corpus_file(tmp_path, passages)
    data = tmp_path / "train.parquet"
    pd.DataFrame({"question": ["capital of zorv?", "capital of mab?"],
                  "golden_answers": [["Quel", "Quell"], ["Dorn"]]}).to_parquet(data)
    env = Search(data=str(data), corpus=str(corpus), question_key="question", answer_key="golden_answers")
    env.reset(0)
    assert env.question in ("capital of zorv?", "capital of mab?") and env.golds in (["Quel", "Quell"], ["Dorn"])
    with pytest.raises(ValueError, match="needs env.corpus"):
        Search(data=str(data))
    with pytest.raises(ValueError, match="needs env.corpus"):
        config.load("search-cpu", None, {"env.data": str(data)})


def test_chance_and_a_tiny_training_run(tmp_path):
    from freshper.trainer.model.load import stop_token_ids
    from freshper.trainer.train.loop import Trainer

    over = {"model.tiny_hidden": 64, "model.tiny_layers": 1, "model.tiny_vocab": 512, "rollout.episodes": 8,
            "rollout.group_size": 4, "algo.replay_batch": 8, "train.iterations": 2, "train.sft_steps": 2,
            "eval.every": 0, "env.max_turns": 3, "train.progress": False, "train.threads": 1}
    cfg = config.load("search-cpu", None, over)
    c = chance(cfg, 64)
    assert 0.0 <= c["success"] < 0.2
    tr = Trainer(cfg, tmp_path / "s")
    assert tr.tok.convert_tokens_to_ids("</search>") in stop_token_ids(tr.tok)
    rows = tr.run()
    assert all("searches" in r and "answer_f1" in r for r in rows)
    # retrieved passages are context: they are in the episodes, never under the loss mask
    from freshper.trainer.model.chat import Episode

    env = tr._new_env()
    env.reset(3)
    ep = Episode(tr.tok, env.opening("", 16))
    reply = tr.tok("<search>" + env.question + "</search>", add_special_tokens=False)["input_ids"]
    r = env.step(ep.add_reply(reply, []))
    assert ep.add_user(env.feedback(r, 16))
    text_in_loss = tr.tok.decode([t for t, m in zip(ep.ids, ep.mask) if m])
    assert "Doc 1(Title:" in tr.tok.decode(ep.ids) and "Doc 1" not in text_in_loss and "information" not in text_in_loss
    assert torch.isfinite(torch.tensor([r["loss"] for r in rows])).all()
