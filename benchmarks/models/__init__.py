"""Model definitions written for plait's benchmarks and tests (no torchvision dependency).

Example:
    >>> import torch
    >>> from benchmarks.models import mlp
    >>> mlp.MLP(8, 16, 4)(torch.randn(2, 8)).shape
    torch.Size([2, 4])
"""
