"""The policy model: loading it (load.py; packaged GGUF weights in pretrained.py), LoRA adapters,
the shared-prompt forward (prefix.py), sharding over ranks, vision inputs, the loss step
(policy.py), and an episode as the token sequence the model reads (chat.py); the warm starts,
training procedures, live in trainer/train/. Imports only the config, the environments and the
process group; engines and the training loop build on it."""
