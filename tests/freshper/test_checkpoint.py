"""Save/load through the CPU mirror: round trip, atomicity, refusal of bad files."""
import json
import os

import pytest
import torch

from freshper import ReplayBuffer, linear_beta
from freshper import checkpoint as ckpt

from .helpers import filled


@pytest.mark.parametrize("sampler", ["tree", "scan"])
@pytest.mark.parametrize("mode", ["uniform", "per", "freshper"])
def test_round_trip_next_sample_identical(tmp_path, mode, sampler):
    buf = filled(mode, sampler=sampler, beta=linear_beta(0.4, 1.0, 50))
    buf.sample(16)  # advance the RNG
    path = tmp_path / "buf.safetensors"
    buf.save(path)
    other = ReplayBuffer.load(path)
    assert other.sampler == sampler and len(other) == len(buf) and other.step == buf.step
    a, b = buf.sample(64, step=buf.step + 2), other.sample(64, step=other.step + 2)
    assert torch.equal(a.indices, b.indices)
    assert torch.equal(a.weights, b.weights) and torch.equal(a.probs, b.probs)
    assert torch.equal(a.tok, b.tok) and a.beta == b.beta
    torch.testing.assert_close(buf.probabilities(), other.probabilities(), rtol=0, atol=0)
    # and both go on identically after further writes
    for x in (buf, other):
        x.add(torch.tensor([2.0, 3.0]), step=x.step + 1, tok=torch.ones(2, 5, dtype=torch.long), ret=torch.ones(2))
    assert torch.equal(buf.sample(32).indices, other.sample(32).indices)


def test_state_dict_is_a_copy():
    buf = filled()
    sd = buf.state_dict()
    before = sd["tensors"]["log_base"].clone()
    buf.update_priorities(torch.tensor([0]), torch.tensor([100.0]))
    assert torch.equal(sd["tensors"]["log_base"], before)
    fresh = ReplayBuffer(buf.capacity)
    fresh.load_state_dict(sd)
    assert not torch.equal(fresh.probabilities(), buf.probabilities())


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "buf.safetensors"
    buf = filled()
    buf.save(path)
    good = path.read_bytes()
    buf.add(torch.ones(3), step=buf.step + 1, tok=torch.zeros(3, 5, dtype=torch.long), ret=torch.zeros(3))

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        buf.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["buf.safetensors"]  # no temp file left
    assert len(ReplayBuffer.load(path)) == 48


def test_refuses_truncated_file(tmp_path):
    path = tmp_path / "buf.safetensors"
    filled().save(path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match="not a readable"):
        ReplayBuffer.load(path)
    with pytest.raises(FileNotFoundError):
        ReplayBuffer.load(tmp_path / "missing.safetensors")


def _rewrite(path, edit_meta=None, edit_tensors=None):
    tensors, meta = ckpt.read_safetensors(path)
    if edit_meta:
        edit_meta(meta)
    if edit_tensors:
        edit_tensors(tensors)
    ckpt.write_safetensors(path, tensors, meta)


@pytest.mark.parametrize("edit,match", [
    (dict(edit_meta=lambda m: m.update(format_version=99)), "format_version"),
    (dict(edit_meta=lambda m: m.update(format="other")), "format"),
    (dict(edit_meta=lambda m: m["config"].update(capacity=10)), "log_base"),
    (dict(edit_meta=lambda m: m["counters"].update(size=3)), "size"),
    (dict(edit_tensors=lambda t: t.update({"field.tok": t["field.tok"][:, :2].contiguous()})), "field.tok"),
    (dict(edit_tensors=lambda t: t.pop("rng")), "rng"),
])
def test_refuses_inconsistent_file(tmp_path, edit, match):
    path = tmp_path / "buf.safetensors"
    filled().save(path)
    _rewrite(path, **edit)
    with pytest.raises(ValueError, match=match):
        ReplayBuffer.load(path)


def test_load_state_dict_checks_before_changing(tmp_path):
    buf = filled()
    other = ReplayBuffer(16)
    with pytest.raises(ValueError, match="capacity"):
        other.load_state_dict(buf.state_dict())
    assert len(other) == 0


def test_custom_beta_callable_must_be_given_on_load(tmp_path):
    path = tmp_path / "buf.safetensors"
    buf = filled(beta=lambda s: 0.5)
    buf.save(path)
    with pytest.raises(ValueError, match="beta"):
        ReplayBuffer.load(path)
    assert ReplayBuffer.load(path, beta=lambda s: 0.5).sample(2).beta == 0.5


def test_file_is_plain_safetensors_with_json_header(tmp_path):
    path = tmp_path / "buf.safetensors"
    filled().save(path)
    raw = path.read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    meta = json.loads(header["__metadata__"]["freshper"])
    assert meta["format_version"] == ckpt.FORMAT_VERSION and meta["counters"]["size"] == 48


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the pinned-memory side-stream mirror needs CUDA")
def test_cuda_buffer_round_trip_through_the_mirror(tmp_path):
    buf = filled("freshper", device="cuda")
    buf.sample(8)
    path = tmp_path / "cuda.safetensors"
    buf.save(path)
    assert all(t.is_pinned() for t in buf._mirror.wait().values())
    other = ReplayBuffer.load(path, device="cuda")
    a, b = buf.sample(64, step=buf.step + 1), other.sample(64, step=other.step + 1)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.weights, b.weights)
    assert a.indices.is_cuda and torch.equal(a.tok, b.tok)
