"""plait's benchmarks and the model definitions they (and the capture tests) use."""
