"""The host-sync counter sees each kind of sync-like call on the CPU, and nothing else."""
import pytest
import torch

from freshper.profiling.host_syncs import HostSyncs

t = torch.arange(6.0)
idx = torch.tensor([1, 2])

SYNCS = {
    "item": lambda: t[0].item(),
    "int": lambda: int(t[1]),
    "bool": lambda: bool((t > 1).any()),
    "tolist": lambda: t.tolist(),
    "numpy": lambda: t.numpy(),
    "bool index": lambda: t[t > 2],
    "nonzero": lambda: (t > 2).nonzero(),
    "unique": lambda: torch.unique(t),
    "host data": lambda: torch.tensor([1.0, 2.0]),
    "scalar setitem": lambda: t.clone().__setitem__(idx, 3.0),
    "repeat_interleave": lambda: torch.repeat_interleave(torch.tensor([1, 2]).clone()),
}
CLEAN = {
    "arith": lambda: (t * 2 + 1).exp(),
    "index": lambda: t[idx],
    "index_fill": lambda: t.clone().index_fill_(0, idx, 3.0),
    "nonzero_static": lambda: torch.nonzero_static(t > 2, size=3),
    "full": lambda: torch.full((3,), 2.0),
    "rsub": lambda: 3 - t,
    "cumsum/searchsorted": lambda: torch.searchsorted(torch.cumsum(t, 0), t),
}


@pytest.mark.parametrize("name", sorted(SYNCS))
def test_each_sync_is_seen(name):
    with HostSyncs() as syncs:
        SYNCS[name]()
    assert syncs.events, name
    assert "test_host_syncs.py" in syncs.report()


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_device_only_ops_are_not(name):
    with HostSyncs() as syncs:
        CLEAN[name]()
    assert not syncs.events, syncs.report()


def test_methods_restored():
    orig = torch.Tensor.tolist
    with HostSyncs():
        pass
    assert torch.Tensor.tolist is orig
