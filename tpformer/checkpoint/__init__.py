"""Checkpoints through torch.distributed.checkpoint: every rank writes its own shards."""
