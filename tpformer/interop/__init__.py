"""Hugging Face checkpoints in and out: each family's adapter (families/) and the layout-aware
loading and saving of a built model (hf: each TP rank reads its shard, export gathers over TP
and rank 0 writes through save_pretrained). Above models/, which describe the network only."""
