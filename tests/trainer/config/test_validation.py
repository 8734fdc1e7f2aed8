"""The config's checks (trainer/config/fields.py per field, checks.py across fields): every field
rejects a bad value before anything is built, naming the field; combinations no single field's
rule can see; what this machine lacks for a config."""
import pytest

from freshper.trainer import config as C
from freshper.trainer.cli import main

# One refused value per field, declared beside the field (opt(..., bad=...)).
INVALID = C.invalid_examples()


def test_every_field_declares_a_value_it_refuses():
    assert set(INVALID) == set(C.field_table())


def test_a_rule_without_its_words_is_refused_where_it_is_declared():
    """A field with a rule must say in words what passes (its errors show them): opt() refuses
    one without, at import, so no field can reach a user with a wordless error."""
    with pytest.raises(TypeError, match="needs allowed="):
        C.opt(1, "a field", rule=lambda v: v > 0, bad="0")
    assert all(text for _, text in C.rules().values())


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("FRESHPER_CACHE", str(cache))
    return cache


@pytest.mark.parametrize("key", sorted(INVALID))
def test_each_field_fails_fast_with_its_name(key, tmp_path, empty_cache, capsys):
    runs = tmp_path / "runs"
    argv = ["train", "--preset", "tiny", f"--{key}", INVALID[key]]
    if key != "train.run_dir":
        argv += ["--train.run_dir", str(runs)]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err, err
    assert not runs.exists(), "a run folder was made before the options were checked"
    assert not empty_cache.exists(), "the model was built before the options were checked"


@pytest.mark.parametrize("over,needle", [
    ({"rollout.episodes": 6, "rollout.group_size": 4}, "multiple of rollout.group_size"),
    ({"rollout.max_new_tokens": 200, "rollout.max_len": 160}, "rollout.max_len"),
    ({"algo.tau_min": 100.0, "algo.tau_max": 50.0}, "algo.tau_min"),
    ({"algo.replay_batch": 64, "algo.capacity": 32}, "algo.capacity"),
    ({"env.name": "sokoban", "env.size": 4, "env.boxes": 2}, "env.boxes"),
])
def test_cross_field_rules(over, needle):
    with pytest.raises(ValueError, match=needle):
        C.load("tiny", None, over)


def test_valid_values_pass():
    cfg = C.load("tiny", None, {"algo.tau": "inf", "model.path": "Qwen/Qwen2.5-0.5B-Instruct", "train.name": "x.1"})
    assert cfg.algo.tau == float("inf")


def test_a_preset_names_the_local_data_it_cannot_default(tmp_path):
    with pytest.raises(ValueError, match="preset qwen2.5-3b-nq-search needs --env.data and --env.eval_data"):
        C.load("qwen2.5-3b-nq-search")
    train = tmp_path / "train.parquet"
    train.write_bytes(b"")
    with pytest.raises(ValueError, match="needs --env.eval_data"):
        C.load("qwen2.5-3b-nq-search", None, {"env.data": str(train)})
    cfg = C.load("qwen2.5-3b-nq-search", None, {"env.data": str(train), "env.eval_data": str(train)})
    assert cfg.env.retriever.startswith("http://") and cfg.env.corpus == "", "the service brings its corpus"


def test_search_questions_need_passages_to_search(tmp_path):
    data = tmp_path / "q.parquet"
    data.write_bytes(b"")
    with pytest.raises(ValueError, match="env.data for search needs env.corpus"):
        C.load("search-cpu", None, {"env.data": str(data)})
    C.load("search-cpu", None, {"env.data": str(data), "env.retriever": "http://127.0.0.1:8100"})


@pytest.mark.parametrize("env,key,value", [("frozenlake", "env.boxes", 2), ("math", "env.max_turns", 3),
                                           ("sokoban", "env.p_frozen", 0.5), ("search", "env.digits", 3),
                                           ("geoqa", "env.top_k", 5), ("frozenlake-vlm", "env.prompts", "replay"),
                                           # at its default value too: given is given (it would be unused)
                                           ("frozenlake", "env.digits", 2), ("math", "env.size", 4)])
def test_an_option_of_another_environment_is_named(env, key, value):
    with pytest.raises(ValueError, match=f"{key}={value!r} is not an option of env.name={env!r}"):
        C.load("tiny", None, {"env.name": env, key: value})


def test_a_presets_options_for_its_own_environment_do_not_follow_another_one():
    cfg = C.load("tiny", None, {"env.name": "math"})  # tiny sets env.max_turns 3 for its FrozenLake
    assert cfg.env.max_turns == C.EnvConfig().max_turns
    with pytest.raises(ValueError, match="env.max_turns=3 is not an option of env.name='math'"):
        C.load("tiny", None, {"env.name": "math", "env.max_turns": 3})


def test_each_environment_declares_options_its_constructor_takes():
    import inspect

    from freshper.trainer.config import env_kwargs
    from freshper.trainer.envs import ENVS

    table = C.field_table()
    for name, cls in ENVS.items():
        assert all(f"env.{o}" in table for o in cls.OPTIONS), name
        cfg = C.load("tiny", None, {"env.name": name})
        params = inspect.signature(cls.__init__).parameters
        assert set(env_kwargs(cfg)) <= set(params), name
    assert C.env_options("math") == ("name", "format_penalty", "data", "eval_data", "question_key", "answer_key",
                                     "digits", "scorer", "operands", "operation", "held_out", "last_digits", "reward",
                                     "success_at")


def test_flash_attention_without_flash_attn_is_refused_before_anything_is_built(monkeypatch):
    """model.attn flash_attention_2 on a machine without flash-attn: the refusal names the way out
    (one of issue 77's surviving mutants removed it)."""
    import importlib.util

    from freshper.trainer.config.checks import missing_install

    cfg = C.load("tiny", None, {"model.attn": "flash_attention_2"})
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a))
    why = missing_install(cfg)
    assert why is not None and "model.attn=flash_attention_2 but flash-attn is not installed" in why
    assert "--model.attn sdpa" in why
    assert missing_install(C.load("tiny", None, {"model.attn": "sdpa"})) is None


def test_the_generation_workers_device_is_refused_where_this_machine_cannot_place_it(monkeypatch):
    """rollout.worker_device names a GPU the machine has, and two vLLM engines on the trainer's GPU
    leave it memory for training; checked on a machine given two (faked) CUDA devices."""
    import torch

    from freshper.trainer.config.checks import device_refusal

    def why(**over):
        return device_refusal(C.load("tiny", None, {"rollout.asynchronous": True, **over}))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert why(**{"rollout.worker_device": "cuda"}) == ("rollout.worker_device='cuda': this machine has no CUDA "
                                                         "device; allowed: auto, cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert why(**{"rollout.worker_device": "cuda:7"}) == (
        "rollout.worker_device='cuda:7': this machine has CUDA devices cuda:0 to cuda:1; allowed: auto, cpu, cuda or "
        "cuda:N with N < 2")
    vllm = {"rollout.engine": "vllm", "rollout.gpu_memory_utilization": 0.6}
    for shared in ("auto", "cuda", "cuda:0"):
        assert "=0.6 of its memory: 1.2 in all leaves none for training" in why(**vllm,
                                                                                 **{"rollout.worker_device": shared})
    assert why(**vllm, **{"rollout.worker_device": "cuda:1"}) is None, "a GPU of its own"
    assert why(**{**vllm, "rollout.gpu_memory_utilization": 0.45}) is None
    assert why(**{**vllm, "rollout.engine": "hf"}) is None, "the HF engine holds no memory of its own"
    assert why(**vllm, **{"train.device": "cpu"}) is None, "the trainer on the CPU"
    assert why(**{"rollout.worker_device": "cuda:1"}) is None
