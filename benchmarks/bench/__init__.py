"""The pieces of the ResNet classification benchmark (``benchmarks/resnet_classification.py``).

``config`` (options and presets), ``data`` (the image set and the fixed weights), ``systems``
(eager, plait, torch.compile and the ablation variants), ``timing`` (clocks, percentiles, memory,
machine facts), ``worker`` (fresh-process compile measurements), ``parity`` (the conformance gate
and the displayed errors), ``training`` and ``report`` (JSON, Markdown, chart); progress on
stderr is :mod:`plait.progress`.
"""
