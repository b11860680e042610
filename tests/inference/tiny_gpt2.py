"""A tiny GPT-2 the inference tests build and save with save_pretrained, with a byte-level BPE
tokenizer trained here on a few lines of text (transformers loads both back)."""

from __future__ import annotations

from pathlib import Path

TEXT = [
    "To be, or not to be, that is the question:",
    "Whether 'tis nobler in the mind to suffer",
    "The slings and arrows of outrageous fortune,",
    "Or to take arms against a sea of troubles",
    "And by opposing end them. To die: to sleep;",
    "No more; and by a sleep to say we end",
    "The heart-ache and the thousand natural shocks",
    "That flesh is heir to, 'tis a consummation",
]
EOS = "<|endoftext|>"


def save_tiny_gpt2(
    directory: Path,
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    positions: int = 96,
    seed: int = 0,
    std: float = 0.3,
) -> Path:
    """Weights drawn at std 0.3 (not GPT-2's 0.02): a random model then prefers different
    tokens at different positions, so greedy completions are not one token repeated."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(TEXT, trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS, bos_token=EOS, unk_token=EOS
    )
    fast.save_pretrained(directory)
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=len(fast),
        n_positions=positions,
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        initializer_range=std,
        eos_token_id=fast.eos_token_id,
        bos_token_id=fast.eos_token_id,
    )
    model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(directory)
    return directory
