"""Vision-language RL end to end on CPU with a tiny Qwen2-VL: FrozenLake-VLM and GeoQA through the
trainer (rollout with images, log-prob recompute, updates, the buffer's images, resume), and the
proof that the trainer's log-probs of generated tokens equal the engine's."""
import pytest
import torch

from freshper.trainer import config
from freshper.trainer.train.loop import Trainer

pytestmark = pytest.mark.slow(100)

# unprocessed sampling in float32: the engine's recorded log-probs are the model's own
EXACT = {"rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.top_k": 0}


def vlm(env="frozenlake-vlm", **over):
    base = {"env.name": env, "env.image_pixels": 112, "rollout.max_len": 1024, "model.tiny_hidden": 128,
            "train.iterations": 2, "algo.mode": "freshper", "algo.replay_updates": 1, **EXACT}
    if env == "geoqa":
        base.update({"rollout.max_new_tokens": 12, "rollout.max_len": 96})
    return config.load("tiny", None, {**base, **over})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tr = Trainer(vlm(), tmp_path_factory.mktemp("vlm") / "fl")
    return tr, tr.run()


def test_frozenlake_vlm_trains_with_images_through_the_buffer(run):
    tr, rows = run
    assert tr.processor is not None and type(tr.model).__name__ == "Qwen2VLForConditionalGeneration"
    for r in rows:
        assert r["env_steps"] > 0 and r["gen_tokens"] > 0 and r["image_bytes"] > 0
        assert all(v == v for v in r.values() if isinstance(v, float)), "no NaN"
    assert "images" in tr.buffer.field_names and rows[-1]["replay_rows"] > 0
    assert 0 <= rows[-1]["replay_age_max"] <= 1


def test_trainer_logprobs_equal_the_engines_on_image_episodes(run):
    """Images, their placeholders and the M-RoPE positions reach the training forward as they
    reached generation: the recompute equals the engine's log-probs to float32 rounding (text
    episodes: ~1e-6). Without mm_token_type_ids in the forward they differ by ~1e-3."""
    _, rows = run
    assert all(r["engine_trainer_logp_maxdiff"] < 1e-4 for r in rows), [r["engine_trainer_logp_maxdiff"] for r in rows]


def test_replayed_rows_are_scored_on_their_own_images(run):
    """Rows stored in the trainer's buffer and drawn back are scored on images decoded from the
    buffer's bytes exactly as the rollout's own pixels score them: the buffer brings back what
    the model saw. Swapping two rows' images changes the result (the check can fail)."""
    from freshper.images import pack_pngs
    from freshper.trainer.config import env_kwargs
    from freshper.trainer.engines import Sampling
    from freshper.trainer.train.rollout import rollout

    tr, _ = run
    cfg = tr.cfg
    ep = rollout(tr.engine, tr.tok, cfg.env.name, env_kwargs(cfg), [5, 6], 1, cfg.rollout.max_new_tokens,
                 cfg.rollout.max_len, Sampling(1.0, 1.0, 0), processor=tr.processor)
    zeros = torch.zeros(2)
    slots = tr.buffer.add(torch.ones(2), step=tr.iteration, tokens=ep.tokens.to(torch.int32), mask=ep.mask,
                          old_logp=ep.engine_logp, engine_logp=ep.engine_logp, score=zeros, reward=zeros,
                          group=torch.arange(2), adv=zeros, images=pack_pngs(ep.pngs, cfg.rollout.image_bytes),
                          gen_lag=torch.zeros(2, dtype=torch.int8))
    b = tr.buffer._batch(slots, torch.ones(2), torch.ones(2), tr.iteration, 0.4)
    want = tr.policy.logprobs(ep.tokens, ep.mask, vision=ep.vision)
    replayed = tr._replayed_images(b)
    assert torch.equal(tr.policy.logprobs(b.tokens, b.mask, vision=replayed), want)
    replayed.pixels, replayed.grids = replayed.pixels[::-1], replayed.grids[::-1]
    assert (tr.policy.logprobs(b.tokens, b.mask, vision=replayed) - want).abs().max() > 1e-4


def test_a_trained_vlm_exports_as_a_folder_that_loads_with_its_image_processor(run, tmp_path):
    """RUN/final/ and `freshper export` hold the image processor config beside the weights, so
    the folder loads as the VLM it is (and `freshper eval` can show it pictures)."""
    from transformers import AutoModelForImageTextToText

    from freshper.trainer.model.vision import image_processor
    from freshper.trainer.train.export import export

    tr, _ = run
    for folder in (tr.run_dir / "final", export(tr.run_dir, tmp_path / "exported")):
        assert (folder / "preprocessor_config.json").is_file()
        image_processor(folder)
        m = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
        for (n, a), (_, b) in zip(tr.model.state_dict().items(), m.state_dict().items()):
            assert torch.equal(a, b), n


def test_resume_keeps_the_buffers_images(tmp_path):
    a = Trainer(vlm(**{"train.iterations": 2}), tmp_path / "r")
    a.run(iterations=1)
    saved = a.buffer._fields["images"][:len(a.buffer)].clone()
    del a
    b = Trainer(vlm(**{"train.iterations": 2}), tmp_path / "r", resume=True)
    assert torch.equal(b.buffer._fields["images"][:len(b.buffer)], saved)
    assert b.run()[-1]["iteration"] == 1


def test_geoqa_trains_on_figures(tmp_path):
    tr = Trainer(vlm("geoqa", **{"rollout.episodes": 8, "rollout.group_size": 4, "algo.replay_batch": 8,
                                 "algo.micro_batch": 8}), tmp_path / "g")
    rows = tr.run()
    assert rows[-1]["env_steps"] == 2 * 8 and rows[-1]["image_bytes"] > 0
    assert all(r["engine_trainer_logp_maxdiff"] < 1e-4 for r in rows)


def test_sokoban_vlm_shows_the_level_as_a_picture(tmp_path):
    from freshper.trainer.envs import make_env
    from freshper.trainer.envs.picture_games import draw_board
    from freshper.trainer.envs.prompts import IMAGE

    env = make_env("sokoban-vlm", cell=10)
    state = env.reset(4)
    msgs = env.opening(state, 8)
    assert msgs[1]["content"].count(IMAGE) == 1 and state not in msgs[1]["content"], "the picture, not the text"
    assert env.images()[0].tobytes() == draw_board(state.splitlines(), 10).tobytes()
    r = env.step("<answer>Up</answer>")
    assert env.feedback(r, 8).count(IMAGE) == 1
    rows = Trainer(vlm("sokoban-vlm", **{"train.iterations": 1, "env.size": 6}), tmp_path / "s").run()
    assert rows[0]["image_bytes"] > 0 and rows[0]["engine_trainer_logp_maxdiff"] < 1e-4


def test_vision_envs_need_a_vlm(tmp_path):
    from freshper.trainer.engines import Sampling
    from freshper.trainer.train.rollout import rollout

    with pytest.raises(ValueError, match="needs a vision-language model"):
        rollout(None, None, "frozenlake-vlm", {}, [0], 1, 8, 512, Sampling())
