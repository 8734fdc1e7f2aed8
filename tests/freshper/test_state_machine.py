"""Random add / sample / update / save / load sequences against a plain-Python model."""
import math
import tempfile
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from freshper import ReplayBuffer

CAP = 12
prio = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)


class BufferModel(RuleBasedStateMachine):
    """The model keeps per slot (priority, birth, payload) and the FIFO pointer, and computes
    P(i) from the paper's formula, with no log-keys and no tree."""

    mode = "freshper"
    sampler = "tree"
    sync_free = None

    def __init__(self):
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp())

    @initialize(tau=st.sampled_from([1.0, 7.0, 500.0]), alpha=st.sampled_from([0.0, 0.6, 1.0]))
    def setup(self, tau, alpha):
        self.buf = ReplayBuffer(CAP, mode=self.mode, alpha=alpha, tau=tau, beta=0.5, sampler=self.sampler, seed=3,
                                sync_free=self.sync_free)
        self.slots = [None] * CAP  # (priority, birth, payload)
        self.next = 0
        self.step = 0
        self.payload = 0

    def probs(self):
        logw = self.log_weights()
        if not self.live():
            return torch.zeros(CAP, dtype=torch.float64)
        return torch.softmax(logw, 0)

    def log_weights(self):
        logw = []
        for s in self.slots:
            if s is None:
                logw.append(-math.inf)
                continue
            p, b, _ = s
            lp = math.log(p + self.buf.eps)
            if self.mode == "uniform":
                logw.append(0.0)
            elif self.mode == "per":
                logw.append(self.buf.alpha * lp)
            else:
                logw.append(self.buf.alpha * (lp - (self.step - b) / self.buf.tau))
        return torch.tensor(logw, dtype=torch.float64)

    @rule(ps=st.lists(prio, min_size=1, max_size=5), dt=st.integers(0, 3000))
    def add(self, ps, dt):
        self.step += dt
        n = len(ps)
        payload = torch.arange(self.payload, self.payload + n)
        self.payload += n
        slots = self.buf.add(torch.tensor(ps, dtype=torch.float64), step=self.step, x=payload)
        want = [(self.next + i) % CAP for i in range(n)]
        assert slots.tolist() == want
        for i, s in enumerate(want):
            self.slots[s] = (ps[i], self.step, int(payload[i]))
        self.next = (self.next + n) % CAP

    def live(self):
        return [i for i, s in enumerate(self.slots) if s is not None]

    @precondition(lambda self: any(s is not None for s in self.slots))
    @rule(b=st.integers(1, 40), dt=st.integers(0, 50))
    def sample(self, b, dt):
        self.step += dt
        batch = self.buf.sample(b, step=self.step)
        logw = self.log_weights()
        assert all(self.slots[i] is not None for i in batch.indices.tolist())
        assert [self.slots[i][2] for i in batch.indices.tolist()] == batch.x.tolist()
        assert (batch.age == torch.tensor([self.step - self.slots[i][1] for i in batch.indices.tolist()])).all()
        # (P_i / P_min)^-beta in log space: P_min can be far below float64's range
        want_w = torch.exp(-0.5 * (logw[batch.indices] - logw[torch.isfinite(logw)].min()))
        torch.testing.assert_close(batch.weights.double(), want_w, rtol=1e-9, atol=1e-300)

    @precondition(lambda self: any(s is not None for s in self.slots))
    @rule(data=st.data(), restamp=st.booleans(), dt=st.integers(0, 100))
    def update(self, data, restamp, dt):
        live = self.live()
        idx = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=6))
        ps = data.draw(st.lists(prio, min_size=len(idx), max_size=len(idx)))
        step = None
        if restamp:
            self.step += dt
            step = self.step
        self.buf.update_priorities(torch.tensor(idx), torch.tensor(ps, dtype=torch.float64), step=step)
        for i, p in zip(idx, ps):
            _, b, x = self.slots[i]
            self.slots[i] = (p, self.step if restamp else b, x)

    @rule()
    def save_load(self):
        path = self.tmp / "b.safetensors"
        self.buf.save(path)
        loaded = ReplayBuffer.load(path)
        if len(self.buf):
            a = self.buf.sample(8, step=self.step)
            c = loaded.sample(8, step=self.step)
            assert torch.equal(a.indices, c.indices) and torch.equal(a.weights, c.weights)
        self.buf = loaded

    @rule(dt=st.integers(-5, -1))
    def earlier_step_is_refused(self, dt):
        if self.buf.step is None or self.buf.step + dt < 0:
            return
        with pytest.raises(ValueError, match="step"):
            self.buf.probabilities(step=self.buf.step + dt)

    @invariant()
    def distribution_matches_model(self):
        if not hasattr(self, "buf"):
            return
        assert len(self.buf) == len(self.live())
        torch.testing.assert_close(self.buf.probabilities(), self.probs(), rtol=1e-9, atol=1e-300)


MACHINE_SETTINGS = settings(max_examples=25, stateful_step_count=20, deadline=None,
                            suppress_health_check=[HealthCheck.too_slow])


def _machine(mode, sampler, sync_free=None):
    return type(f"Machine_{mode}_{sampler}", (BufferModel,), {"mode": mode, "sampler": sampler,
                                                                "sync_free": sync_free})


TestFreshperTree = _machine("freshper", "tree").TestCase
TestFreshperScan = _machine("freshper", "scan").TestCase
TestPerTree = _machine("per", "tree").TestCase
TestUniformTree = _machine("uniform", "tree").TestCase
TestFreshperSyncFree = _machine("freshper", "scan", sync_free=True).TestCase  # the CUDA step's code path
for _case in (TestFreshperTree, TestFreshperScan, TestPerTree, TestUniformTree, TestFreshperSyncFree):
    _case.settings = MACHINE_SETTINGS
del _case
