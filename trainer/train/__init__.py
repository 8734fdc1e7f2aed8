"""The training loop (loop.py: rollout, advantages, replay, update, evaluation, per iteration) and
what a run keeps: checkpoints, metrics, trackers, provenance, the exported policy, and the
statistics it reports (drift for freshper-auto's tau, intervals). Builds on model/, engines/ and
envs/; nothing below imports it."""
