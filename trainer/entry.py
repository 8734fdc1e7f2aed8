"""The `freshper` console command: checks the trainer's extra dependencies, then runs the CLI.

`pip install freshper` installs the library and its kernels only; the trainer's dependencies
come with `pip install 'freshper[train]'`. Without them the command says which extra to install
instead of failing on the first import.
"""
from __future__ import annotations

import importlib.util
import sys

# module name -> the distribution that provides it, all in the `train` extra
TRAIN_MODULES = {"yaml": "pyyaml", "tqdm": "tqdm", "matplotlib": "matplotlib", "transformers": "transformers",
                 "tokenizers": "tokenizers", "gymnasium": "gymnasium", "datasets": "datasets",
                 "math_verify": "math-verify", "bm25s": "bm25s"}


def missing_train_modules() -> list[str]:
    """Distributions of the `train` extra that are not installed."""
    return [dist for mod, dist in TRAIN_MODULES.items() if importlib.util.find_spec(mod) is None]


def main(argv=None) -> int:
    missing = missing_train_modules()
    if missing:
        print(f"freshper: the trainer needs the 'train' extra (missing: {', '.join(missing)}); install it with\n"
              f"    pip install 'freshper[train]'    (from a checkout: pip install -e '.[train]')", file=sys.stderr)
        return 2
    from .cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
