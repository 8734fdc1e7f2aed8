"""The TRL integration on several processes (torchrun, gloo on CPU): each rank stores its own
completions, replay draws the global distribution, DDP keeps the ranks' weights equal, each rank
checkpoints its shard and a resume on one process redeals them; and the per-rank loss weights
add up to the one-process loss for every loss_type."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")

from tests.freshper.test_trl_integration import make  # noqa: E402

SCRIPT = Path(__file__).with_name("trl_ranks.py")


def _run(launch, model, out):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([*launch, str(SCRIPT), model, str(out)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_two_processes_store_their_own_completions_and_replay_one_distribution(tmp_path, tiny_model_dir):
    out = tmp_path / "out"
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"], tiny_model_dir, out)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in ranks] == [2, 2] and [r["size"] for r in ranks] == [8, 8]
    assert not set(ranks[0]["prompts"]) & set(ranks[1]["prompts"]), "each rank stores the completions it generated"
    for d0, d1 in zip(ranks[0]["draws"], ranks[1]["draws"]):
        assert d0[0] == d1[0] == 8 and d0[1] + d1[1] == 8, "the ranks' rows are one global batch of 4 x 2"
        assert d0[2] + d1[2] == pytest.approx(2.0), "loss weights: the ranks' shares times 2, summing to 2"
    assert ranks[0]["checksum"] == ranks[1]["checksum"], "replay gradients are reduced: the weights stay equal"
    assert all(r["replay_logged"] == 2 for r in ranks)
    ck = out / "checkpoint-2"
    assert (ck / "freshper_buffer_rank0.safetensors").exists() and (ck / "freshper_buffer_rank1.safetensors").exists()

    done = subprocess.run([sys.executable, str(SCRIPT), tiny_model_dir, str(out), "resume"], capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"},
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    one = json.loads((out / "rank0.json").read_text())
    assert one["world"] == 1 and one["loaded"] == [16], "both shards redealt into one buffer"
    assert one["size"] == 20 and set(one["prompts"]) >= set(ranks[0]["prompts"]) | set(ranks[1]["prompts"])


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo", "cispo", "sapo", "luspo", "vespo"])
def test_rank_shares_of_the_loss_add_up_to_the_whole_batch(tmp_path, tiny_model_dir, loss_type):
    """What _sharded_batch weights each rank's loss by: for a loss that divides by its own rows or
    tokens, its share of the batch as loss_type counts it; for the token-summed ones (dapo, cispo,
    vespo) 1, their divisor being the whole batch's tokens. The two halves of a batch, weighted
    so, sum to the loss of the whole batch."""
    tr = make(tmp_path, tiny_model_dir, loss_type=loss_type, replay_tau=1.0)
    tr.train()
    b = tr.replay_buffer.sample(6, step=tr.state.global_step)
    cm = b.fields["completion_mask"].clone()
    for i, keep in enumerate([8, 2, 5, 1, 0, 3]):  # rows of unequal lengths, one empty: counts that differ
        cm[i, keep:] = 0
    b.fields["completion_mask"] = cm
    ids, att, c1, b = tr._replay_batch(0, batch=b)
    num_items = b.completion_mask[:, :c1].sum().float()
    whole, _ = tr.replay_loss(tr.replay_inputs(ids, att, c1, b, num_items))
    total = tr.replay_share(b.completion_mask[:, :c1].bool())
    parts = []
    for rows in (slice(0, 3), slice(3, 6)):
        sub = type(b)(b.indices[rows], b.weights[rows], b.probs[rows], b.birth[rows], b.age[rows], b.beta,
                      {k: v[rows] for k, v in b.fields.items()})
        sids, satt, sc1, sb = tr._replay_batch(0, batch=sub)
        loss, _ = tr.replay_loss(tr.replay_inputs(sids, satt, sc1, sb, num_items))
        share = tr.replay_share(sb.completion_mask[:, :sc1].bool()) / total if tr._locally_normalised() else 1.0
        parts.append(loss * share)
    assert float(sum(parts)) == pytest.approx(float(whole), rel=1e-5, abs=1e-7)
    assert abs(float(parts[0])) > 1e-6 and abs(float(whole)) > 1e-6, "the premise: non-zero losses"
