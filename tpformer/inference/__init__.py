"""Using a trained causal LM: generation with a tensor-parallel KV cache, and perplexity."""
