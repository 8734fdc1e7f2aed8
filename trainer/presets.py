"""The presets: named sets of config values (`freshper train --preset NAME`), applied over the
dataclass defaults of trainer/config/options.py, under a --config file and the command line.

CPU presets run here (the tiny models built from scratch, SmolLM2-135M-Instruct); GPU presets
are the paper's settings (weights and data must be on the machine or reachable from the hub).
"""
from __future__ import annotations

# The paper's setting on a GPU node, from the authors' replay configs (examples/replay_buffer/*.yaml
# of their code; where those are silent, ROLL's agentic examples they build on): Qwen2.5-0.5B-
# Instruct, 128 groups x 8 = 1,024 episodes per iteration, 128-token replies, 4,096-token episodes,
# 100 iterations, one replay update per iteration (train_steps_per_env_step: 1) of a rollout-sized
# batch, lr 1e-6 cosine with 10 warm-up steps, bf16, vLLM, validation every 5 iterations on 1,024
# episodes sampled as in training, and one batch generated ahead (async_generation_ratio 1 in
# their agentic configs: rollout.lag 1; their math (RLVR) configs and our NQ preset generate
# synchronously: lag 0 there). Weights must be on the machine or reachable from the hub.
_PAPER_GPU = {"model.path": "Qwen/Qwen2.5-0.5B-Instruct", "rollout.engine": "vllm", "rollout.lag": 1,
              "algo.staleness": "none",  # the authors train the lagged batch as if fresh
              "rollout.episodes": 1024,
              "rollout.group_size": 8, "rollout.max_new_tokens": 128, "rollout.max_len": 4096,
              "rollout.gpu_memory_utilization": 0.5, "eval.every": 5, "eval.episodes": 1024, "algo.lr": 1e-6,
              "algo.replay_updates": 1, "algo.replay_batch": 1024, "algo.micro_batch": 8, "train.sft_steps": 0,
              "train.iterations": 100, "model.gradient_checkpointing": True}
_SOKOBAN_SIMPLE = {"env.name": "sokoban", "env.size": 6, "env.boxes": 1, "env.search_depth": 300, "algo.tau": 500.0}
_SOKOBAN_HARD = {"env.name": "sokoban", "env.size": 8, "env.boxes": 2, "env.search_depth": 10, "algo.tau": 500.0}

PRESETS: dict[str, dict] = {
    # FrozenLake with the tiny model on CPU (the dataclass defaults), the paper's conventions at tiny
    # scale. CPU capacities hold every trajectory of the run (or of a compare budget), as the
    # paper's 50k-100k buffers do, without allocating 100k whole-episode rows.
    "frozenlake": {"algo.capacity": 4096},
    "sokoban-simple": {**_SOKOBAN_SIMPLE, "rollout.max_len": 1408, "train.iterations": 200, "algo.capacity": 8192},
    "sokoban-hard": {**_SOKOBAN_HARD, "rollout.max_len": 1664, "train.iterations": 300, "algo.capacity": 16384},
    # Seconds per iteration; for tests and smoke checks. 60 format warm-start steps leave a tenth or
    # more of the replies valid, so seed 0's first iterations have rewards that differ within a
    # group, non-zero advantages and a gradient (with 2 steps every reply was invalid: every update
    # was a no-op, and the end-to-end tests could not tell a trainer that learns from one that
    # does not).
    "tiny": {"model.tiny_hidden": 64, "model.tiny_layers": 1, "model.tiny_vocab": 512, "rollout.episodes": 4,
             "rollout.group_size": 2, "env.max_turns": 3, "algo.replay_batch": 4, "algo.capacity": 32,
             "algo.replay_updates": 1, "algo.micro_batch": 4, "rollout.max_len": 640, "eval.every": 0,
             "eval.episodes": 2, "train.iterations": 2, "train.sft_steps": 60, "train.checkpoint_every": 1,
             "train.progress": False, "train.threads": 1},
    "qwen2.5-0.5b-frozenlake": {**_PAPER_GPU, "algo.tau": 1000.0, "env.prompts": "replay"},
    "qwen2.5-0.5b-sokoban-simple": {**_PAPER_GPU, **_SOKOBAN_SIMPLE},
    "qwen2.5-0.5b-sokoban-hard": {**_PAPER_GPU, **_SOKOBAN_HARD},
    # Math. CPU: a + b with one-digit operands, scored by the same verifier as real data; the
    # tiny model learns it (slowly: eval avg@4 from 0.05, chance, to ~0.1-0.15 in 200 iterations,
    # a few minutes) with the advantage clip off and a constant lr of 3e-4; with the paper's
    # +-0.2 clip on whitened advantages the rare early successes carry too little weight, and
    # lr 1e-3 learns and collapses again (measured; docs/environments.md, "Math").
    # GPU: the paper's AIME setting as far as the paper states
    # it (docs/environments.md, "Math"): a MATH training set, AIME 2024 as the held-out set, long replies.
    "math-cpu": {"env.name": "math", "env.digits": 1, "env.scorer": "boxed",
                 "rollout.max_new_tokens": 16,
                 "rollout.max_len": 96, "rollout.episodes": 64, "rollout.group_size": 8, "algo.replay_batch": 64,
                 "algo.capacity": 16384, "algo.micro_batch": 64, "eval.every": 20, "eval.episodes": 32,
                 "eval.samples": 4, "eval.temperature": 1.0, "train.iterations": 200, "algo.tau": 200.0,
                 "algo.adv_clip": 0.0, "algo.lr": 3e-4, "algo.lr_schedule": "constant"},
    # A real pretrained LLM on the CPU: SmolLM2-135M-Instruct (trainer/model/pretrained.py), one-digit
    # addition in the authors' math prompt. Scored by the last number of the reply: the authors'
    # rule (math-verify over the whole reply) credits restating the question, which is most of
    # the untrained model's score on this task (measured: results/HISTORY.md, "Where SmolLM2 starts").
    # lr 1e-5: the policy drifts 0.03 nats/token per iteration of age, so tau = 1 / (2 * 0.03) = 17
    # iterations (trainer/train/drift.py's rule); 15 iterations fit in 10 minutes on 2 cores.
    "smollm2-135m-math": {"model.path": "smollm2-135m", "env.name": "math", "env.digits": 1,
                          "env.scorer": "last-number", "rollout.max_new_tokens": 32, "rollout.max_len": 160,
                          "rollout.episodes": 32, "rollout.group_size": 8, "algo.replay_batch": 32,
                          "algo.replay_updates": 1, "algo.capacity": 16384, "algo.micro_batch": 32,
                          "eval.every": 15, "eval.episodes": 32, "eval.samples": 4, "eval.temperature": 1.0,
                          "train.iterations": 15, "algo.tau": 17.0, "algo.adv_clip": 0.0, "algo.lr": 1e-5,
                          "algo.lr_schedule": "constant", "algo.warmup_steps": 0},
    # The pre-registered study's setting (results/study-multiply/REGISTRATION.md): SmolLM2 on one-digit
    # multiplication, 30% of the problems held out by content (validation: those 31, 4 replies
    # each), 2 problems x 8 replies per iteration, lr 2e-5, at which replayed data is off-policy
    # within the run (the pilot's PER: 0.18 nats/token of KL(mu || pi) over its last 10
    # iterations); tau 25 is the pilot's drift time 1/(2r).
    "smollm2-135m-multiply": {"model.path": "smollm2-135m", "env.name": "math", "env.digits": 1,
                              "env.operation": "multiply", "env.held_out": 0.3, "env.scorer": "last-number",
                              "rollout.max_new_tokens": 32, "rollout.max_len": 160, "rollout.episodes": 16,
                              "rollout.group_size": 8, "algo.replay_batch": 16, "algo.replay_updates": 1,
                              "algo.capacity": 16384, "algo.micro_batch": 16, "eval.every": 10, "eval.episodes": 31,
                              "eval.samples": 4, "eval.temperature": 1.0, "train.iterations": 30,
                              "algo.tau": 25.0, "algo.adv_clip": 0.0, "algo.lr": 2e-5,
                              "algo.lr_schedule": "constant", "algo.warmup_steps": 0},
    # Search agents on CPU: questions about an invented knowledge base (answers exist only in its
    # passages), BM25 search, at most 5 searches and 10 turns as the paper's code sets them; 400
    # format warm-start steps (60 left 15-30% of replies malformed; 400: 0.1%).
    # SmolLM2 plays Sokoban-simple (6x6, one box) on a CPU: a format warm start on random valid
    # moves, then RL; validation on boards training never draws (env.held_out, by content), 8
    # states at a time (eval.batch: its peak 2.5 GB instead of 6.7, BENCHMARKS.md). The turn
    # limit, budget and learning rate come from the pilot (results/PILOTS.md, "Sokoban-simple with
    # SmolLM2: the first pilot").
    "smollm2-135m-sokoban": {**_SOKOBAN_SIMPLE, "model.path": "smollm2-135m", "env.max_turns": 5,
                             "env.held_out": 0.3, "rollout.max_new_tokens": 16, "rollout.max_len": 768,
                             "rollout.episodes": 8, "rollout.group_size": 4, "algo.replay_batch": 8,
                             "algo.replay_updates": 1, "algo.capacity": 16384, "algo.micro_batch": 2,
                             "eval.every": 10, "eval.episodes": 32, "eval.samples": 2, "eval.temperature": 1.0,
                             "eval.batch": 8, "train.iterations": 30, "train.sft_steps": 6, "train.sft_lr": 1e-4,
                             "algo.adv_clip": 0.0, "algo.lr": 2e-5, "algo.lr_schedule": "constant",
                             "algo.warmup_steps": 0},
    # SmolLM2 plays FrozenLake: the game study's setting (results/study-frozenlake/REGISTRATION.md).
    # 3x3 boards with the start and goal in the corners and 6 moves, where a policy that moves Down
    # or Right without reading the board already pays (4x4 random maps were not learned);
    # validation on boards held out by content. Every run loads one warm start: 3 supervised steps
    # on a solver's moves drawn with seed 100 (random valid moves left every
    # early group without a success). No KL penalty, as the authors' FrozenLake config; lr 5e-5,
    # at which replayed data goes measurably off-policy (pilot 8: 0.072 nats/token). tau = 64 is
    # freshper-auto's rule 1/(2r) on pilot 8's drift. 12 iterations are about 560 env steps.
    "smollm2-135m-frozenlake": {"model.path": "smollm2-135m", "env.name": "frozenlake", "env.size": 3,
                                "env.corners": True, "env.max_turns": 6, "env.held_out": 0.3,
                                "rollout.max_new_tokens": 16, "rollout.max_len": 640, "rollout.episodes": 16,
                                "rollout.group_size": 4, "algo.replay_batch": 16, "algo.replay_updates": 1,
                                "algo.capacity": 16384, "algo.micro_batch": 2, "eval.every": 4, "eval.episodes": 32,
                                "eval.samples": 2, "eval.temperature": 1.0, "eval.batch": 8, "train.iterations": 12,
                                "train.sft_steps": 3, "train.sft_replies": "solver", "train.sft_seed": 100,
                                "train.sft_lr": 1e-4, "algo.tau": 64.0, "algo.adv_clip": 0.0, "algo.lr": 5e-5,
                                "algo.kl_coef": 0.0, "algo.lr_schedule": "constant", "algo.warmup_steps": 0},
    "search-cpu": {"env.name": "search", "env.max_turns": 10, "rollout.max_new_tokens": 16, "rollout.max_len": 768,
                   "rollout.episodes": 64, "rollout.group_size": 8, "algo.replay_batch": 64, "algo.capacity": 16384,
                   "algo.micro_batch": 32, "eval.every": 20, "eval.episodes": 32, "eval.samples": 2,
                   "train.iterations": 150, "algo.tau": 200.0, "algo.adv_clip": 0.0, "algo.lr": 3e-4,
                   "algo.lr_schedule": "constant", "train.sft_steps": 400, "env.passage_words": 60},
    # NQ search on a GPU node. The authors' code fixes the environment (10 turns, 5 searches, top-3)
    # and an E5/FAISS retrieval server on port 8100 (`python -m freshper.trainer.envs.retrieval
    # serve --retriever e5:DIR --port 8100`); the rest is our choice after Search-R1's NQ scripts:
    # Qwen2.5-3B-Instruct, 512 questions x 5 replies per iteration, 500 tokens per turn, lr 1e-6.
    # env.data / env.eval_data must name the local NQ train and test parquet files.
    "qwen2.5-3b-nq-search": {**_PAPER_GPU, "model.path": "Qwen/Qwen2.5-3B-Instruct", "env.name": "search",
                             "rollout.lag": 0,
                             "env.retriever": "http://127.0.0.1:8100", "rollout.episodes": 2560,
                             "rollout.group_size": 5, "rollout.max_new_tokens": 500, "rollout.max_len": 4096,
                             "algo.replay_batch": 2560, "algo.tau": 500.0, "eval.episodes": 512},
    "qwen2.5-7b-math-aime": {**_PAPER_GPU, "model.path": "Qwen/Qwen2.5-7B-Instruct", "env.name": "math",
                             "rollout.lag": 0,
                             "env.data": "hub:DigitalLearningGmbH/MATH-lighteval",
                             "env.answer_key": "solution", "env.eval_data": "hub:HuggingFaceH4/aime_2024",
                             "rollout.max_new_tokens": 4096, "rollout.max_len": 5120, "rollout.episodes": 512,
                             "rollout.group_size": 8, "eval.episodes": 30, "eval.samples": 16,
                             "eval.temperature": 0.6, "algo.replay_batch": 512, "algo.micro_batch": 4,
                             "algo.tau": 500.0, "train.iterations": 300},
    # Vision-language, CPU: a tiny Qwen2-VL (a one-block vision tower) built offline. FrozenLake-VLM
    # and Sokoban-VLM as the text games with the board drawn 112 x 112 (FrozenLake: one image token
    # per board cell); GeoQA as math-cpu with procedural figures whose numbers are in the picture only.
    "frozenlake-vlm-cpu": {"env.name": "frozenlake-vlm", "env.image_pixels": 112, "algo.capacity": 4096,
                           "rollout.max_len": 1536},
    "sokoban-vlm-cpu": {**_SOKOBAN_SIMPLE, "env.name": "sokoban-vlm", "env.image_pixels": 112, "rollout.max_len": 1536,
                        "train.iterations": 200, "algo.capacity": 8192},
    "geoqa-cpu": {"env.name": "geoqa", "env.image_pixels": 112, "rollout.max_new_tokens": 16,
                  "rollout.max_len": 128, "rollout.episodes": 64, "rollout.group_size": 8, "algo.replay_batch": 64,
                  "algo.capacity": 16384, "algo.micro_batch": 64, "eval.every": 20, "eval.episodes": 32,
                  "eval.samples": 4, "eval.temperature": 1.0, "train.iterations": 200, "algo.tau": 200.0,
                  "algo.adv_clip": 0.0, "algo.lr": 3e-4, "algo.lr_schedule": "constant"},
    # Vision-language, GPU. FrozenLake-VLM: the paper's FrozenLake setting with Qwen2.5-VL-3B-Instruct
    # (the model of the authors' vision-language agentic example) and the board at 64 pixels a cell
    # (gymnasium's rgb_array size). GeoQA: the authors' VL math example (examples/qwen2.5-vl-7B-math):
    # Qwen2.5-VL-7B-Instruct, 512 x 8 replies of up to 4,096 tokens, lr 1e-6, GRPO without whitening,
    # advantage clip 10, KL loss 0.01; env.data must name the local GeoQA parquet. Both generate
    # with colocated vLLM (images as multimodal inputs), as the text presets do.
    "qwen2.5-vl-3b-frozenlake-vlm": {**_PAPER_GPU, "model.path": "Qwen/Qwen2.5-VL-3B-Instruct",
                                     "env.name": "frozenlake-vlm", "env.image_pixels": 256, "algo.tau": 1000.0},
    "qwen2.5-vl-7b-geoqa": {**_PAPER_GPU, "model.path": "Qwen/Qwen2.5-VL-7B-Instruct", "env.name": "geoqa",
                            "rollout.lag": 0, "rollout.episodes": 4096,
                            "rollout.group_size": 8, "rollout.max_new_tokens": 4096, "rollout.max_len": 5120,
                            "algo.advantage": "grpo", "algo.whiten": False, "algo.adv_clip": 10.0,
                            "algo.kl_coef": 0.01, "algo.replay_batch": 4096, "algo.micro_batch": 2,
                            "algo.tau": 500.0, "eval.episodes": 512},
    # The GPU preset in short form: a few iterations with the tiny model, vLLM and bf16.
    "gpu-smoke": {"rollout.engine": "vllm", "train.iterations": 3, "train.device": "cuda", "eval.every": 3,
                  "train.sft_steps": 20, "train.checkpoint_every": 3, "train.progress": False},
    # The same for the vision path: the tiny Qwen2-VL on FrozenLake-VLM, images through vLLM.
    "gpu-smoke-vlm": {"env.name": "frozenlake-vlm", "env.image_pixels": 112, "rollout.max_len": 1024,
                      "rollout.engine": "vllm", "train.iterations": 2, "train.device": "cuda", "eval.every": 2,
                      "train.checkpoint_every": 2, "train.progress": False},
}

# What a preset cannot default (local data): load() names the missing options.
PRESET_NEEDS = {"qwen2.5-3b-nq-search": ("env.data", "env.eval_data")}
PRESET_NEEDS_WHY = {"qwen2.5-3b-nq-search": "NQ's train and test parquet files in Search-R1's format; "
                                            "docs/environments.md, \"Search agents\""}
