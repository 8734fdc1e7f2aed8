"""Padding-free rows for the flash-attention training forward."""
import pytest
import torch

from freshper.trainer.model.sharding import pack, unpack


def test_pack_unpack_round_trip():
    tokens = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0], [1, 2, 3, 4]])
    lengths = torch.tensor([3, 1, 4])
    ids, pos, keep = pack(tokens, lengths)
    assert ids.tolist() == [[5, 6, 7, 8, 1, 2, 3, 4]]
    assert pos.tolist() == [[0, 1, 2, 0, 0, 1, 2, 3]]
    hidden = ids[..., None].float().expand(1, 8, 2)
    out = unpack(hidden, keep)
    assert out.shape == (3, 4, 2)
    assert torch.equal(out[..., 0], (tokens * keep).float())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flash-attention needs CUDA")
def test_packed_flash_attention_matches_padded():
    pytest.importorskip("flash_attn")
    from freshper.trainer import config
    from freshper.trainer.model.load import load_policy

    cfg = config.load("tiny", None, {"model.attn": "flash_attention_2", "model.dtype": "bfloat16"})
    model, _, _ = load_policy(cfg, torch.device("cuda"))
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 17, 3, 9])
    tokens = torch.randint(4, 300, (4, 17), generator=g) * (torch.arange(17)[None] < lengths[:, None])
    tokens, lengths = tokens.cuda(), lengths.cuda()
    ids, pos, keep = pack(tokens, lengths)
    packed = unpack(model.model(input_ids=ids, position_ids=pos).last_hidden_state, keep)
    sdpa, _, _ = load_policy(config.load("tiny", None, {"model.attn": "sdpa", "model.dtype": "bfloat16"}),
                             torch.device("cuda"))
    attn = (torch.arange(17, device="cuda")[None] < lengths[:, None]).long()
    padded = sdpa.model(input_ids=tokens, attention_mask=attn).last_hidden_state
    torch.testing.assert_close(packed[keep].float(), padded[keep].float(), atol=2e-2, rtol=2e-2)
