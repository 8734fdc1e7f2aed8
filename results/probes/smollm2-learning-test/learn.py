"""The learning test's configuration with the loop's advantages as they are, negated or zeroed.

    python learn.py honest|negated|zeroed ITERATIONS LR [THREADS SEED]
(lr1e-5-6iters.txt: lr 1e-5, 6 iterations, 2 threads; lr3e-5-8iters.txt: lr 3e-5, 8 iterations, 1 thread;
 test-setting.txt: the test's own setting, lr 3e-5, 8 iterations, 2 threads, seeds 0 and 1)
"late-early" is the test's statistic: mean success of iterations 4-7 minus that of iterations 0-1.
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
threads = int(sys.argv[4]) if len(sys.argv) > 4 else 1
seed = int(sys.argv[5]) if len(sys.argv) > 5 else 0
over = {"algo.mode": "on-policy", "train.iterations": int(sys.argv[2]), "algo.lr": float(sys.argv[3]),
        "eval.every": 0, "train.progress": False, "train.threads": threads, "train.seed": seed}
rows = Trainer(config.load("smollm2-135m-math", None, over), tempfile.mkdtemp()).run()
s = [r["success"] for r in rows]
late = s[4:] if len(s) >= 8 else s[3:]
print(variant, f"threads {threads} seed {seed}", [round(x, 3) for x in s], "late-early",
      round(sum(late) / len(late) - sum(s[:2]) / 2, 3), flush=True)
