"""Triton kernels, each beside its torch reference. Nothing here knows about buffers or models.

On CUDA the public functions run the Triton kernels; elsewhere the torch references. Importing
this package loads triton where it is installed; `import freshper` (the buffer) does not import
this package until its first sample.
"""
if __name__ == "kernels":  # the folder imported by its bare name from the checkout's root: empty, or
    # Hugging Face's `kernels` where that is installed (freshper/_checkout.py)
    from freshper._checkout import defer_to_installed

    defer_to_installed(__name__)
    del defer_to_installed
else:
    from .fused_linear_policy_loss import LogitsGemm, fused_linear_policy_loss, token_logprobs
    from .policy_loss import AGGREGATIONS, loss_and_grad, policy_loss, policy_loss_reference, policy_loss_triton
    from .sampler import sample, sample_reference, sample_triton

    __all__ = ["policy_loss", "fused_linear_policy_loss", "policy_loss_reference", "policy_loss_triton",
               "loss_and_grad", "token_logprobs", "LogitsGemm", "sample", "sample_reference", "sample_triton",
               "AGGREGATIONS"]
