"""Search agents (Search-R1 style): the model may write <search>query</search>, the environment
answers with <information> and the top-k passages of a local BM25 index, and <answer>...</answer>
ends the episode with exact match against the gold answers as the reward.

Limits and formats as the paper's code sets them for NQ search (its nq_search env config): at most
10 turns and 5 searches (a sixth search ends the episode unanswered), top-3 passages printed as
"Doc i(Title: t) text", the outcome reward only (1 for an exact match, else 0). A turn with
neither a closed <search> nor a closed <answer> (an unclosed tag included) is invalid: the
format penalty, and the same question stands. <think>...</think> may precede either. Retrieved
passages arrive as a user message, so they are context and never loss (the loss mask covers the
assistant's tokens only). The paper's code repeats the system prompt and the question in every
observation; here the episode is one chat, which holds them already.

Answers are compared after the standard SQuAD / NQ normalisation: lower case, punctuation and the
articles a / an / the removed, white space collapsed (the paper's code removes articles only
between spaces). `exact_match` and `f1` never raise.

Data:
- `data` empty: a knowledge base generated from the seed (invented countries, people and rivers
  with their facts, so an answer exists only in the corpus, and distractor passages about
  look-alike entities) and questions about it; validation asks about entities training never
  asks about. What a tiny model can learn here: to search with the question's entity and copy
  the answer from the passages.
- `data` a local file in Search-R1's parquet format (`question`, `golden_answers`) or any columns
  named by question_key / answer_key (a list of answers or one), with `corpus` a jsonl of
  {id, title, text} passages; the BM25 index is built once and cached next to the corpus.
- `retriever`: bm25 (default), e5:DIR (dense, FAISS) or the URL of a retrieval service
  (trainer/envs/retrieval.py).
"""
from __future__ import annotations

import functools
import random
import re
import string
from collections import Counter

from .base import EVAL_SEED_BASE, QuestionEnv, StepResult, register
from .retrieval import MAX_QUERY_CHARS, Retriever, make_retriever, read_corpus  # noqa: F401  (the env's API)

MAX_TURNS, MAX_SEARCHES, TOP_K = 10, 5, 3  # the paper's code's nq_search defaults
SEARCH_RE = re.compile(r"<search>(.*?)</search>", re.DOTALL)
THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)
ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
INSTRUCTION = ("Answer the question. You may search a knowledge base by writing <search> query </search>; the "
               "top results come back between <information> and </information>. Search as often as you need, then "
               "give the final answer as <answer> answer </answer>, a few words.\n")


# ------------------------------------------------------------------------------ answer checks
def normalize(text: str) -> str:
    """SQuAD / NQ answer normalisation."""
    text = str(text).lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _golds(golds) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    try:
        return [str(g) for g in golds]
    except TypeError:
        return [str(golds)]


def exact_match(prediction, golds) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0. Pure string
    work on str(prediction): nothing to swallow, so nothing is (a scorer bug must surface)."""
    p = normalize(str(prediction))
    return float(any(p == normalize(g) for g in _golds(golds)))


def authors_normalize(text: str) -> str:
    """The authors' NQ normalisation (nq_search/utils.py evaluate_answer_em): lower case,
    punctuation removed, and articles removed only where a space stands on both sides."""
    text = str(text).lower().translate(str.maketrans("", "", string.punctuation))
    for article in (" a ", " an ", " the "):
        text = text.replace(article, " ")
    return " ".join(text.split())


def contains_match(prediction, golds) -> float:
    """The authors' NQ reward: 1.0 if the normalised prediction and a normalised gold answer
    contain one another ("Paris, France" for "Paris", "Roosevelt" for "Theodore Roosevelt").
    One departure, on purpose: a prediction that normalises to "" scores 0. In their code it is
    contained in every gold answer, so `<answer>.</answer>` succeeds on every question, an exploit
    an RL policy finds quickly, not a reward rule."""
    p = authors_normalize(prediction)
    if not p:
        return 0.0
    return float(any(p in g or g in p for g in map(authors_normalize, _golds(golds))))


MATCHES = {"contains": contains_match, "exact": exact_match}  # env.search_match: the success rule


def f1(prediction, golds) -> float:
    """The best token-level F1 of the normalised prediction against any gold answer; 0 when they
    share no token, both empty included (SQuAD's rule)."""
    p = normalize(str(prediction)).split()
    best = 0.0
    for g in _golds(golds):
        t = normalize(g).split()
        common = sum((Counter(p) & Counter(t)).values())
        if common:
            prec, rec = common / len(p), common / len(t)
            best = max(best, 2 * prec * rec / (prec + rec))
    return best


def cut(text: str, words: int) -> str:
    """`text`'s first `words` words (0: all of it)."""
    return " ".join(text.split()[:words]) if words else text


def format_results(passages: list[dict], words: int = 0) -> str:
    """The <information> message as the paper's code prints it: a line break after the opening
    tag and before the closing one, one 'Doc i(Title: t) text [Score: s]' line per passage (the
    score where the retriever gives one; its service returns them), each passage's text cut to
    `words` words when `words` > 0."""
    if not passages:
        return "<information>\nNo results found.\n</information>"
    lines = [f"Doc {i + 1}(Title: {p['title']}) {cut(p['text'], words)}"
             + (f" [Score: {p['score']:.4f}]" if "score" in p else "") for i, p in enumerate(passages)]
    return "<information>\n" + "\n".join(lines) + "\n</information>"


# ------------------------------------------------------------------- a generated knowledge base
_SYL = ["ka", "lo", "mir", "ven", "do", "tar", "sel", "qua", "ri", "bon", "zu", "fel", "ga", "nor", "pi", "thi"]
RELATIONS = {  # relation: (question, passage sentence)
    "capital": ("What is the capital of {e}?", "The capital of {e} is {v}."),
    "founder": ("Who founded {e}?", "{e} was founded by {v}."),
    "river": ("Which river flows through {e}?", "The river {v} flows through {e}."),
}


def _name(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(_SYL) for _ in range(parts)).capitalize()


@functools.lru_cache(maxsize=4)
def generated_kb(seed: int = 0, entities: int = 200) -> tuple[list[dict], list[tuple[str, str]], list[tuple[str, str]]]:
    """(passages, training questions, held-out questions): `entities` invented places, each with a
    capital, a founder and a river, one passage per fact plus a distractor passage per entity that
    names it beside other values. Questions about the last fifth of the entities are held out."""
    rng = random.Random(seed)
    names: set[str] = set()
    while len(names) < entities:
        names.add(_name(rng, 3))
    ents = sorted(names)
    rng.shuffle(ents)
    passages, questions = [], []
    for e in ents:
        facts = {}
        for rel, (q, sentence) in RELATIONS.items():
            v = _name(rng, 2)
            facts[rel] = v
            passages.append({"id": f"{e}-{rel}", "title": e, "text": sentence.format(e=e, v=v)})
            questions.append((q.format(e=e), v))
        other = rng.choice(ents)
        passages.append({"id": f"{e}-note", "title": other, "text": f"Travellers compare {other} with {e}; "
                         f"{_name(rng, 2)} and {_name(rng, 2)} are often confused with {facts['capital']}."})
    cut = len(questions) * 4 // 5
    return passages, questions[:cut], questions[cut:]


@functools.lru_cache(maxsize=4)
def _retriever(spec: str, corpus: str, seed: int):
    return make_retriever(spec, corpus, None if corpus else generated_kb(seed)[0])


def check_search_sources(data: str, corpus: str, retriever: str) -> None:
    """ValueError when a dataset's questions have no passages to search: BM25 needs the corpus
    they are about (a dense index or a service brings its own)."""
    own = retriever.startswith(("e5:", "http://", "https://"))
    if data and not corpus and not own:
        raise ValueError("env.data for search needs env.corpus (the jsonl of passages its questions are about), or "
                         "an env.retriever that serves its own corpus (e5:DIR or a service URL)")


@register
class Search(QuestionEnv):
    name = "search"
    instruction = INSTRUCTION
    # A reply ends with its query or its answer (as Search-R1 cuts replies): the passages must come
    # from the retriever, never from the model writing on past </search>.
    stop_strings = ("</search>", "</answer>")

    OPTIONS = {"max_turns": "max_turns", "format_penalty": "format_penalty", "data": "data", "eval_data": "eval_data",
               "question_key": "question_key", "answer_key": "answer_key", "corpus": "corpus", "top_k": "top_k",
               "max_searches": "max_searches", "retriever": "retriever", "search_match": "match",
               "passage_words": "passage_words"}

    def __init__(self, max_turns: int = MAX_TURNS, format_penalty: float = -0.15, data: str = "",
                 eval_data: str = "", question_key: str = "question", answer_key: str = "golden_answers",
                 corpus: str = "", top_k: int = TOP_K, max_searches: int = MAX_SEARCHES, kb_seed: int = 0,
                 retriever: str = "bm25", match: str = "contains", passage_words: int = 0):
        super().__init__(max_turns, format_penalty)
        if passage_words < 0:
            raise ValueError(f"passage_words must be >= 0 (0: whole passages), got {passage_words}")
        self.passage_words = passage_words
        if match not in MATCHES:
            raise ValueError(f"match must be one of {tuple(MATCHES)}, got {match!r}")
        self.match = match
        if top_k < 1 or max_searches < 0:
            raise ValueError(f"top_k must be >= 1 and max_searches >= 0, got {top_k}, {max_searches}")
        check_search_sources(data, corpus, retriever)
        self.top_k, self.max_searches = top_k, max_searches
        self.retriever = _retriever(retriever, corpus, kb_seed)
        if data:
            from .math import load_problems

            self.train_rows = load_problems(data, question_key, answer_key)
            self.held_out_rows = load_problems(eval_data, question_key, answer_key) if eval_data else \
                self.train_rows[-max(1, len(self.train_rows) // 10):]
        else:
            _, self.train_rows, self.held_out_rows = generated_kb(kb_seed)
        self.question, self.golds = "", []
        self.searches, self.correct, self.answer_f1 = 0, False, 0.0
        self.answer_em = self.answer_contains = 0.0  # both rules, whichever rewards
        self.seen: list[str] = []  # words of the passages the last search returned
        self.copied_queries, self.answer_copied = 0, 0.0  # the mechanics the format warm start teaches

    def _reset(self, seed: int) -> None:
        rows = self.held_out_rows if seed >= EVAL_SEED_BASE else self.train_rows
        base = EVAL_SEED_BASE if seed >= EVAL_SEED_BASE else 0
        self.question, golds = rows[random.Random(seed - base).randrange(len(rows))]
        self.golds = _parse_golds(golds)
        self.searches, self.correct, self.answer_f1 = 0, False, 0.0
        self.answer_em = self.answer_contains = 0.0
        self.seen = []
        self.copied_queries, self.answer_copied = 0, 0.0

    def opening(self, state: str, max_words: int) -> list[dict]:
        return [{"role": "user", "content": f"{INSTRUCTION}Question: {self.question}"}]

    def random_reply(self, rng: random.Random) -> str:
        """A well-formed reply whose choices are uniformly random but whose words come from the
        episode, as a search agent's do: before any search, or with probability 0.3 while searches
        remain, a search for a random span of one or two words of the question; otherwise an
        answer of one random word of the passages the last search returned (of the question when
        nothing was returned). Which span and which word is the task, left to RL; that queries
        copy the question and answers copy the passages is the format the warm start teaches."""
        words = [w.strip("?.,;:!") for w in self.question.split()] or ["?"]
        if self.searches < self.max_searches and (self.searches == 0 or rng.random() < 0.3):
            n = min(len(words), rng.choice((1, 2)))
            i = rng.randrange(len(words) - n + 1)
            return f"<search>{' '.join(words[i:i + n])}</search>"
        return f"<answer>{rng.choice(self.seen or words)}</answer>"

    def step(self, text: str) -> StepResult:
        if self.done:
            raise RuntimeError("search: step() after the episode ended; call reset()")
        self.turn += 1
        # as the authors' env parses a reply: each tag's first occurrence, stripped; valid if any of
        # think / search / answer has content; an answer ends the episode, else a search runs, else
        # (thinking only) the model is told to go on
        think, query, answer = (m.group(1).strip() if m else "" for m in
                                (THINK_RE.search(text), SEARCH_RE.search(text), ANSWER_TAG_RE.search(text)))
        reward, penalty, valid = 0.0, 0.0, True
        if not (think or query or answer):
            valid, penalty = False, self.format_penalty
            obs = "Invalid reply: write <search> query </search> or <answer> answer </answer>."
        elif answer:
            self.answer_em = exact_match(answer, self.golds)
            self.answer_contains = contains_match(answer, self.golds)
            self.correct = (self.answer_contains if self.match == "contains" else self.answer_em) == 1.0
            self.answer_f1 = f1(answer, self.golds)
            words = normalize(answer).split()
            seen = {normalize(w) for w in self.seen}
            self.answer_copied = float(bool(words) and all(w in seen for w in words))
            reward, self.done = float(self.correct), True
            obs = ""
        elif query:
            if self.searches >= self.max_searches:  # the paper's code ends the episode, unanswered
                self.done, obs = True, ""
            else:
                self.searches += 1
                q = normalize(query).split()
                self.copied_queries += bool(q) and f" {' '.join(q)} " in f" {normalize(self.question)} "
                found = self.retriever.search([query], self.top_k)[0]
                obs = format_results(found, self.passage_words)
                self.seen = [w.strip("?.,;:!()") for p in found
                             for w in f"{p['title']} {cut(p['text'], self.passage_words)}".split()]
                self.seen = [w for w in self.seen if w]
        else:
            obs = "Continue with your reasoning..."
        if self.turn >= self.max_turns:
            self.done = True
        return StepResult(obs, reward, penalty, self.done, valid, self.correct, {"searches": self.searches})

    def feedback(self, result: StepResult, max_words: int) -> str:
        return result.observation

    def metrics(self) -> dict:
        """Per-episode figures beside success: searches made, the answer's F1, exact match and
        containment (both rules, whichever env.search_match rewards), the share of
        searches whose query is a span of the question, and whether every word of the answer is
        in the passages the last search returned (0 without an answer)."""
        return {"searches": float(self.searches), "answer_f1": self.answer_f1, "answer_em": self.answer_em,
                "answer_contains": self.answer_contains,
                "query_copied": self.copied_queries / self.searches if self.searches else 0.0,
                "answer_copied": self.answer_copied}



def _parse_golds(golds) -> list[str]:
    """Gold answers from a data cell: a list, a numpy array, the text of a list, or one answer."""
    if isinstance(golds, str) and golds.startswith("["):
        import ast

        try:
            return _golds(ast.literal_eval(golds))
        except (ValueError, SyntaxError):
            pass
    if hasattr(golds, "tolist"):
        golds = golds.tolist()
    return _golds(golds)
