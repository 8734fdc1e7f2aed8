"""TRL's own GRPOTrainer tests, run offline twice: with TRL's class and with FreshPERGRPOTrainer
swapped in (replay on, one replay step per optimizer step), then the two sets of passing tests
compared. Not part of the CI run: it needs a checkout of huggingface/trl (its tests are read from
there at run time, not kept here).

    python tests/trl_suite/run.py /path/to/trl-checkout [--work /tmp/trl-suite]

Stand-ins for what the tests fetch from the hub: the tiny causal LM and reward model
(`trl-internal-testing/tiny-Qwen2ForCausalLM-2.5`, `...ForSequenceClassification-2.5`) are this
project's offline tiny Qwen2 model, and the `zen` dataset's prompt-only configurations are 17
short prompts (4 in the test split). Tests needing other hub models or datasets fail under both
classes alike. GRPOConfig's bf16 default is allowed on the CPU (autocast).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = '''import os

import transformers.training_args as _ta
import trl

_ta.is_torch_bf16_gpu_available = lambda *a, **k: True  # GRPOConfig's bf16 default, on the CPU
if os.environ.get("FRESHPER_SWAP") == "1":
    from freshper.integrations.trl import FreshPERGRPOConfig, FreshPERGRPOTrainer

    trl.GRPOTrainer, trl.GRPOConfig = FreshPERGRPOTrainer, FreshPERGRPOConfig
'''
PROMPTS = ["The sky is", "Water is", "The sun", "A cat", "Trees are", "The moon", "Fire is", "Snow is", "Grass is",
           "The sea", "A dog", "Rain is", "Birds can", "Fish live", "Stars are", "Clouds are", "Ice is"]


def tolerant_imports(text: str) -> str:
    """testing_utils imports availability checks newer than the installed TRL: absent ones say False."""
    for module in ("trl.import_utils", "transformers.utils"):
        m = re.search(rf"from {re.escape(module)} import \((.*?)\)\n", text, flags=re.S)
        if m:
            names = [n.strip() for n in m.group(1).split(",") if n.strip()]
            alias = "_m" + str(abs(hash(module)))
            text = text.replace(m.group(0), f"import {module} as {alias}\n" + "".join(
                f"{n} = getattr({alias}, {n!r}, lambda *a, **k: False)\n" for n in names))
    return text


def stand_ins(work: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer, Qwen2ForCausalLM, Qwen2ForSequenceClassification

    from freshper.trainer import config
    from freshper.trainer.model.load import build_tiny

    src = Path(build_tiny(config.load("math-cpu")))
    root = work / "trl-internal-testing"
    tok = AutoTokenizer.from_pretrained(src)
    for name, model in (("tiny-Qwen2ForCausalLM-2.5", Qwen2ForCausalLM.from_pretrained(src)), (
            "tiny-Qwen2ForSequenceClassification-2.5", None)):
        if model is None:
            cfg = AutoConfig.from_pretrained(src)
            cfg.num_labels, cfg.pad_token_id = 1, tok.pad_token_id
            model = Qwen2ForSequenceClassification(cfg)
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    zen = root / "zen"
    meta = ["---", "configs:"]
    for cfg_name, conversational in (("standard_prompt_only", False), ("conversational_prompt_only", True)):
        (zen / cfg_name).mkdir(parents=True, exist_ok=True)
        meta += [f"- config_name: {cfg_name}", "  data_files:"]
        for split, rows in (("train", PROMPTS), ("test", PROMPTS[:4])):
            with open(zen / cfg_name / f"{split}.jsonl", "w") as f:
                for p in rows:
                    f.write(json.dumps({"prompt": [{"role": "user", "content": p}] if conversational else p}) + "\n")
            meta += [f"  - split: {split}", f"    path: {cfg_name}/{split}.jsonl"]
    (zen / "README.md").write_text("\n".join(meta + ["---", ""]))


def run(work: Path, swap: bool) -> set[str]:
    env = {**os.environ, "FRESHPER_SWAP": "1" if swap else "0", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, "-m", "pytest", "tests/test_grpo_trainer.py", "-q", "-rA",
                          "-p", "no:cacheprovider", "-W", "ignore"], cwd=work, env=env, capture_output=True,
                         text=True)
    (work / f"run-{'freshper' if swap else 'trl'}.log").write_text(out.stdout + out.stderr)
    print(out.stdout.strip().splitlines()[-1])
    return {line.split()[1] for line in out.stdout.splitlines() if line.startswith("PASSED ")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trl_checkout", type=Path)
    ap.add_argument("--work", type=Path, default=Path("/tmp/trl-suite"))
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    (a.work / "tests").mkdir(parents=True)
    for name in ("test_grpo_trainer.py", "__init__.py"):
        shutil.copy(a.trl_checkout / "tests" / name, a.work / "tests" / name)
    text = (a.trl_checkout / "tests" / "testing_utils.py").read_text()
    (a.work / "tests" / "testing_utils.py").write_text(tolerant_imports(text))
    (a.work / "conftest.py").write_text(CONFTEST)
    stand_ins(a.work)
    theirs, ours = run(a.work, swap=False), run(a.work, swap=True)
    print(f"pass with TRL's class: {len(theirs)}; with FreshPERGRPOTrainer: {len(ours)}; both: {len(theirs & ours)}")
    for name in sorted(theirs - ours):
        print("passes only with TRL's class:", name)
    for name in sorted(ours - theirs):
        print("passes only with FreshPERGRPOTrainer:", name)


if __name__ == "__main__":
    main()
