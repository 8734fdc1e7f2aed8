"""What an end-to-end test must see before its other assertions mean anything: a run that
updated the policy. A trainer whose updates are no-ops (all advantages zero, or zeroed by a bug)
passes every bookkeeping check; these fail it."""


def assert_updates(rows, replay: bool = False) -> None:
    """Some iteration had a non-zero gradient (and, with `replay`, a non-zero replay loss)."""
    assert any(r["grad_norm"] > 0 for r in rows), f"no gradient in any iteration: {[r['grad_norm'] for r in rows]}"
    if replay:
        assert any(r["replay_loss"] != 0 for r in rows), "every replay update had zero loss"
