"""A Hugging Face tokenizer.json (byte-level BPE, as Llama 3, GPT-2 and Qwen ship) as
data.tokenizer: the ids transformers' tokenizer gives, the special tokens and BOS/EOS of its
tokenizer_config.json, causal-LM windows with each document between BOS and EOS, and a
converted Llama continued in pretraining on the user's own text with its own tokenizer."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import transformers

from tests.cli.forked import run_script
from tests.data.common import write_corpus
from tests.docs.commands import arguments, documented
from tests.train.test_trainer import QUIET, REPO
from tpformer.config.schema import ParallelConfig
from tpformer.data.causal_lm import CausalLMDataset
from tpformer.data.corpus import CorpusSpec, split_sentences
from tpformer.data.preprocess import preprocess
from tpformer.data.tokenizer import Tokenizer

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def write_byte_level_bpe(directory: Path, corpus: Path, vocab: int = 300) -> Path:
    """A byte-level BPE tokenizer trained with `tokenizers` on the corpus, saved by
    transformers' save_pretrained (tokenizer.json and tokenizer_config.json, BOS and EOS)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, trainers

    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(corpus.read_text().split("\n"), trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=BOS, eos_token=EOS
    )
    fast.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bpe")
    corpus = write_corpus(root / "corpus.txt", documents=12)
    return write_byte_level_bpe(root / "tokenizer", corpus), corpus


def test_ids_and_specials_are_transformers(bpe: tuple[Path, Path]) -> None:
    """The same ids as AutoTokenizer, sentence by sentence with the space before each later
    one (as the whole text gives them); BOS and EOS from tokenizer_config.json; a directory or
    its tokenizer.json."""
    directory, corpus = bpe
    ours = Tokenizer(directory)
    hf = transformers.AutoTokenizer.from_pretrained(directory)
    document = corpus.read_text().split("\n\n")[0].replace("\n", " ")
    sentences = split_sentences(document)
    assert len(sentences) > 2
    got = [i for ids in ours.encode(sentences) for i in ids]
    assert got == hf(" ".join(sentences), add_special_tokens=False)["input_ids"]
    assert (ours.bos_id, ours.eos_id) == (hf.bos_token_id, hf.eos_token_id)
    assert ours.pad_id == ours.eos_id and ours.vocab_size == len(hf)
    assert Tokenizer(directory / "tokenizer.json").fingerprint() == ours.fingerprint()
    with pytest.raises(ValueError, match="no unk_token, cls_token, sep_token, mask_token"):
        ours.check_bert_specials()


def test_causal_windows_put_each_document_between_bos_and_eos(
    bpe: tuple[Path, Path], tmp_path: Path
) -> None:
    directory, corpus = bpe
    tokenizer = Tokenizer(directory)
    spec = CorpusSpec(source="text", paths=(str(corpus),))
    indexed = preprocess(spec, tokenizer, cache=tmp_path, workers=1)
    data = CausalLMDataset(
        indexed, seq_length=32, seed=0, eval_fraction=0.0, bos=tokenizer.bos_id,
        eos=tokenizer.eos_id,
    )  # fmt: skip
    stream = torch.cat([data.train.window(k * 32, 32) for k in range(len(data))])
    docs = indexed.num_documents
    expected: list[int] = []
    for d in range(docs):
        start = indexed.sentence_offsets[indexed.doc_offsets[d]]
        stop = indexed.sentence_offsets[indexed.doc_offsets[d + 1]]
        expected += [tokenizer.bos_id, *indexed.tokens[start:stop].tolist(), tokenizer.eos_id]
    assert stream.tolist() == expected[: len(stream)]
    assert (stream == tokenizer.bos_id).sum() >= docs - 1


@pytest.fixture(scope="module")
def llama_dir(bpe: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("llama"), bpe[0])


def write_tiny_llama(hf_dir: Path, tokenizer: Path) -> Path:
    """A LlamaForCausalLM of the tokenizer's vocabulary saved with it; weights at std 0.3, so
    a random model's greedy completions vary from token to token."""
    size = Tokenizer(tokenizer).vocab_size
    config = transformers.LlamaConfig(
        vocab_size=size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=size - 2, eos_token_id=size - 1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3) if p.dim() > 1 else p.fill_(1.0)
    model.save_pretrained(hf_dir)
    for f in tokenizer.iterdir():
        (hf_dir / f.name).write_bytes(f.read_bytes())
    return hf_dir


ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _named(command: str, names: dict[str, str]) -> dict[str, str]:
    """The replacements of `names` whose documented name the command holds."""
    return {name: here for name, here in names.items() if name in command}


def _cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return run_script(module, args, cwd=Path.cwd(), env=ENV, timeout=600)


@pytest.mark.slow  # over ~5 s: the slow tier
def test_a_converted_llama_continues_pretraining_with_its_own_tokenizer(
    bpe: tuple[Path, Path], llama_dir: Path, tmp_path: Path
) -> None:
    """tpformer-convert from-hf, then tpformer-pretrain resumes it (the model from the
    checkpoint: no model keys) on the user's text at TP=2 with data.tokenizer=<its dir>: the
    first loss is LlamaForCausalLM's on that batch."""
    _, corpus = bpe
    names = {"path/to/llama": str(llama_dir), "runs/llama": str(tmp_path / "ours"),
             "my.txt": str(corpus)}  # docs/llama.md's names -> this test's files  # fmt: skip
    convert = documented("tpformer-convert from-hf path/to/llama runs/llama")
    converted = _cli("tpformer.cli.convert", *arguments(convert, _named(convert, names))[1])
    assert converted.returncode == 0, converted.stderr[-2000:]
    continued = documented("tpformer-pretrain data=text data.paths=[my.txt] data.tokenizer=")
    result = _cli(
        "tpformer.cli.pretrain", *arguments(continued, _named(continued, names))[1],
        f"data.cache_dir={tmp_path}",
        "data.seq_length=32", "trainer.micro_batch_size=4", "trainer.max_steps=3",
        "trainer.progress=false", *QUIET, "trainer.log_every=1",
        f"hydra.run.dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    tokenizer = Tokenizer(llama_dir)
    spec = CorpusSpec(source="text", paths=(str(corpus),))
    indexed = preprocess(spec, tokenizer, cache=tmp_path, workers=1)
    data = CausalLMDataset(
        indexed, seq_length=32, seed=ParallelConfig().seed, eval_fraction=0.02,
        bos=tokenizer.bos_id, eos=tokenizer.eos_id,
    )  # fmt: skip
    batch = data.batch(range(4))["input_ids"]
    hf = transformers.LlamaForCausalLM.from_pretrained(llama_dir).eval()
    with torch.no_grad():
        expected = hf(input_ids=batch, labels=batch).loss.item()
    assert first["step"] == 1 and abs(first["loss"] - expected) <= 1e-4 * expected, first


@pytest.mark.slow  # over ~5 s: the slow tier
def test_tpformer_generate_continues_a_llama_prompt_as_transformers(
    llama_dir: Path, tmp_path: Path
) -> None:
    """tpformer-generate at TP=2 from the Llama directory, its tokenizer.json read by
    AutoTokenizer: the greedy ids and text of LlamaForCausalLM.generate on the same ids."""
    prompt = "To be"  # docs/llama.md's command, 12 new tokens
    command = documented("tpformer-generate init=path/to/llama")
    done = _cli(
        "tpformer.cli.generate", *arguments(command, {"path/to/llama": str(llama_dir)})[1],
        "max_new_tokens=12", f"hydra.run.dir={tmp_path / 'gen'}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "gen" / "completions.jsonl").read_text())
    tokenizer = transformers.AutoTokenizer.from_pretrained(llama_dir)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    hf = transformers.LlamaForCausalLM.from_pretrained(llama_dir).eval()
    want = hf.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)[
        0, ids.shape[1] :
    ].tolist()
    assert record["output_ids"][: len(want)] == want[: len(record["output_ids"])]
    assert len(set(want)) > 3, want  # not a degenerate model
    assert record["text"] == tokenizer.decode(record["output_ids"])
