"""The Hugging Face export tokenizes the same: `AutoTokenizer.from_pretrained` on what to-hf
writes gives the ids tpformer gave in training (sentencepiece BPE and unigram, WordPiece), a
BERT export adds [CLS]/[SEP] as BERT was trained, and a GPT's config names BOS/EOS/PAD ids
inside its vocabulary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import transformers

from tests.inference.tiny_gpt2 import save_tiny_gpt2
from tpformer.data.corpus import read_shakespeare, split_sentences
from tpformer.data.tokenizer import SPECIAL_TOKENS, Tokenizer, train_sentencepiece
from tpformer.interop.hf_tokenizer import export_tokenizer

SENTENCES = [s for play in list(read_shakespeare())[:8] for s in split_sentences(play)]
TRAINED, HELD_OUT = SENTENCES[: len(SENTENCES) // 2], SENTENCES[len(SENTENCES) // 2 :][:2000]
HARD = [
    "To be, or not to be, that is the question:",
    "  leading, double  and trailing spaces  ",
    "café naïve résumé — “quoted” ‘words’",
    "ＦＵＬＬ width ① and ligature ﬁ (NFKC folds them)",
    "line\nbreak\tand tab",
    "unseen 漢字 and emoji 🙂",
    "",
]


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def sentencepiece_dir(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp(f"sp_{request.param}")
    train_sentencepiece(TRAINED, out, vocab_size=600, model_type=request.param)
    return out


@pytest.mark.parametrize("arch", ["bert", "gpt"])
def test_a_sentencepiece_export_gives_the_same_ids(
    sentencepiece_dir: Path, arch: str, tmp_path: Path
) -> None:
    ours = Tokenizer(sentencepiece_dir)
    special = export_tokenizer(sentencepiece_dir, tmp_path, arch)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    texts = HELD_OUT + HARD
    theirs = hf(texts, add_special_tokens=False)["input_ids"]
    mismatched = [t for t, a, b in zip(texts, ours.encode(texts), theirs) if a != b]
    assert mismatched == []
    assert len(hf) == ours.vocab_size
    assert hf.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == ours.special_ids
    assert hf.decode(theirs[0]) == texts[0]
    if arch == "bert":
        a, b = ours.encode(HARD[:2])
        pair = hf(HARD[0], HARD[1])
        assert pair["input_ids"] == [ours.cls_id, *a, ours.sep_id, *b, ours.sep_id]
        assert pair["token_type_ids"] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        assert special == {"pad_token_id": 0, "bos_token_id": None, "eos_token_id": None}
    else:
        assert hf(HARD[0])["input_ids"] == ours.encode(HARD[:1])[0]  # GPT adds nothing
        assert special == {"pad_token_id": ours.pad_id, "bos_token_id": ours.cls_id,
                           "eos_token_id": ours.sep_id}  # fmt: skip


def test_a_wordpiece_export_gives_the_same_ids(tmp_path: Path) -> None:
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, normalizers, pre_tokenizers, trainers

    backend = Backend(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.train_from_iterator(
        TRAINED, trainers.WordPieceTrainer(vocab_size=600, special_tokens=list(SPECIAL_TOKENS))
    )
    source = tmp_path / "wordpiece"  # as an imported BERT's tokenizer/ holds it
    source.mkdir()
    vocab = sorted(backend.get_vocab().items(), key=lambda item: item[1])
    (source / "vocab.txt").write_text("".join(f"{token}\n" for token, _ in vocab))
    ours = Tokenizer(source)
    export_tokenizer(source, tmp_path / "hf", "bert")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    texts = HELD_OUT + HARD
    theirs = hf(texts, add_special_tokens=False)["input_ids"]
    assert [t for t, a, b in zip(texts, ours.encode(texts), theirs) if a != b] == []


def test_to_hf_of_a_gpt_names_special_ids_inside_its_vocabulary(
    sentencepiece_dir: Path, tmp_path: Path
) -> None:
    """A GPT checkpoint whose run tokenized with sentencepiece: GPT-2's config defaults
    (bos/eos 50256) would lie outside its vocabulary."""
    from tpformer.convert import from_hf, to_hf

    gpt2 = save_tiny_gpt2(tmp_path / "gpt2")
    for file in gpt2.iterdir():
        if "token" in file.name and file.name != "tokenizer.model":
            file.unlink()
    shutil.copy(sentencepiece_dir / "tokenizer.model", gpt2 / "tokenizer.model")
    checkpoint = from_hf(gpt2, tmp_path / "run")
    to_hf(checkpoint, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (2, 3, 0)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    ours = Tokenizer(sentencepiece_dir)
    assert hf(HARD[0])["input_ids"] == ours.encode(HARD[:1])[0]
