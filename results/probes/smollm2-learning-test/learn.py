"""The learning test's configuration with the loop's advantages as they are, negated or zeroed.

    python learn.py honest|negated|zeroed ITERATIONS LR
(lr1e-5-6iters.txt: lr 1e-5, 6 iterations, 2 threads; lr3e-5-8iters.txt: lr 3e-5, 8 iterations, 1 thread)
"""
import sys
import tempfile

from freshper.trainer import config
from freshper.trainer.loop import Trainer

variant = sys.argv[1]
if variant != "honest":
    orig = Trainer._advantages

    def changed(self, score, group, mask):
        adv, tok = orig(self, score, group, mask)
        return (adv, -tok) if variant == "negated" else (adv, 0 * tok)

    Trainer._advantages = changed
over = {"algo.mode": "on-policy", "train.iterations": int(sys.argv[2]), "algo.lr": float(sys.argv[3]),
        "eval.every": 0, "train.progress": False, "train.threads": 1}
rows = Trainer(config.load("smollm2-135m-math", None, over), tempfile.mkdtemp()).run()
s = [r["success"] for r in rows]
print(variant, [round(x, 3) for x in s], "late-early", round(sum(s[3:]) / 3 - sum(s[:2]) / 2, 3), flush=True)
