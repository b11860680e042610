"""A checkpoint's tokenizer as a Hugging Face tokenizer directory that `AutoTokenizer` loads and
that gives the ids tpformer gave in training.

A sentencepiece model (tpformer's own, BPE or unigram) becomes a `tokenizers` pipeline built
from its model proto, step for step as SentencePiece encodes: its precompiled normalizer, the
extra-whitespace rule, the whitespace escape and dummy prefix, its pieces and scores (BPE merges
ranked by the score of the merged piece), and the user-defined pieces ([CLS], [SEP], [MASK])
kept whole. The sentencepiece model travels too (data.tokenizer=<export> continues pretraining
with it). A WordPiece directory is written by BertTokenizerFast; Hugging Face tokenizer files
brought in by an import travel as they are.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SP_FILE = "tokenizer.model"
HF_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
BERT_SPECIALS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}
"""The special tokens of tpformer's sentencepiece models (ids 0-4) and BERT's WordPiece."""
GPT_ROLES = {"bos_token": "[CLS]", "eos_token": "[SEP]"}
"""Which of them a causal LM's config names as BOS and EOS: ids inside its vocabulary."""

NORMAL, USER_DEFINED = 1, 4
"""SentencePiece's piece types (sentencepiece_model.proto)."""


def sentencepiece_pipeline(model_file: Path) -> Any:
    """A `tokenizers.Tokenizer` that encodes as SentencePieceProcessor(model_file).encode."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Tokenizer, decoders

    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated
    proto.ParseFromString(model_file.read_bytes())
    user_defined = [p.piece for p in proto.pieces if p.type == USER_DEFINED]
    tokenizer = Tokenizer(_pieces_model(proto, model_file, bool(user_defined)))
    spec = proto.normalizer_spec
    tokenizer.normalizer = _normalizer(spec)
    pre_tokenizer = _pre_tokenizer(spec, user_defined)
    if pre_tokenizer is not None:
        tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(content=" ", left=1)]
        if spec.add_dummy_prefix
        else [decoders.Replace("▁", " ")]
    )
    return tokenizer


def _pieces_model(proto: Any, model_file: Path, has_user_defined: bool) -> Any:
    """BPE (merges ranked by the score of the merged piece, as SentencePiece merges) or
    Unigram (the pieces' log-probabilities) over the model's pieces, ids unchanged."""
    from tokenizers.models import BPE, Unigram

    pieces, trainer = list(proto.pieces), proto.trainer_spec
    if trainer.model_type == 2:  # BPE
        normal = {p.piece: (p.score, i) for i, p in enumerate(pieces) if p.type == NORMAL}
        ranked = sorted(
            (-score, i, token[:k], token[k:])
            for token, (score, i) in normal.items()
            for k in range(1, len(token))
            if token[:k] in normal and token[k:] in normal
        )
        return BPE(
            vocab={p.piece: i for i, p in enumerate(pieces)},
            merges=[(left, right) for _, _, left, right in ranked],
            unk_token=trainer.unk_piece,
            fuse_unk=True,
            byte_fallback=trainer.byte_fallback,
            ignore_merges=has_user_defined,
        )
    if trainer.model_type == 1:  # unigram
        return Unigram([(p.piece, p.score) for p in pieces], trainer.unk_id, trainer.byte_fallback)
    raise ValueError(
        f"{model_file}: sentencepiece model type {trainer.model_type} cannot be exported; "
        "tpformer trains bpe or unigram (data.tokenizer_type)"
    )


def _normalizer(spec: Any) -> Any:
    """SentencePiece's normalizer spec, in its order."""
    from tokenizers import Regex, normalizers

    steps: list[Any] = []
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:  # spaces only: SentencePiece leaves newlines alone
        steps += [
            normalizers.Replace(Regex(r"\A +| +\z"), ""),
            normalizers.Replace(Regex(" {2,}"), " "),
        ]
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", "▁"))
    if spec.add_dummy_prefix:  # Metaspace would skip the prefix before a leading "▁"
        steps.append(normalizers.Replace(Regex(r"\A▁"), "▁▁"))
    return normalizers.Sequence(steps)


def _pre_tokenizer(spec: Any, user_defined: list[str]) -> Any:
    """The dummy prefix, and the user-defined pieces isolated (SentencePiece emits them whole
    and never merges them); None when neither applies."""
    from tokenizers import Regex, pre_tokenizers

    splits: list[Any] = []
    if spec.add_dummy_prefix:
        splits.append(
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)
        )
    if user_defined:
        pattern = "|".join(re.escape(p) for p in sorted(user_defined, key=len, reverse=True))
        splits.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated"))
    return pre_tokenizers.Sequence(splits) if splits else None


def _bert_template(tokenizer: Any, cls_id: int, sep_id: int) -> None:
    """[CLS] a [SEP] (b [SEP]) with token types 0/1: the inputs BERT was trained on."""
    from tokenizers import processors

    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )


def export_tokenizer(source: Path, out: Path, arch: str) -> dict[str, int | None]:
    """Write the tokenizer of a checkpoint's tokenizer/ directory into `out` and return the
    special ids its Hugging Face config records (pad, bos, eos), each inside the vocabulary or
    None (a GPT run without tokenizer: synthetic data)."""
    from transformers import (  # type: ignore[attr-defined]  # lazy module
        AutoTokenizer,
        BertTokenizerFast,
        PreTrainedTokenizerFast,
    )

    if (source / "vocab.txt").is_file():
        fast = BertTokenizerFast.from_pretrained(str(source))
    elif (source / SP_FILE).is_file():
        pipeline = sentencepiece_pipeline(source / SP_FILE)
        roles = {**BERT_SPECIALS, **(GPT_ROLES if arch == "gpt" else {})}
        missing = [t for t in roles.values() if pipeline.token_to_id(t) is None]
        if missing:
            raise ValueError(f"{source / SP_FILE} lacks the special pieces {missing}")
        if arch == "bert":
            _bert_template(pipeline, pipeline.token_to_id("[CLS]"), pipeline.token_to_id("[SEP]"))
        inputs = ["input_ids", "attention_mask"]
        if arch == "bert":  # segment ids, as BERT was trained with them
            inputs.insert(1, "token_type_ids")
        fast = PreTrainedTokenizerFast(tokenizer_object=pipeline, model_input_names=inputs, **roles)
        _copy(source, out, [source / SP_FILE])  # tpformer's own Tokenizer reads the model
    elif any((source / f).is_file() for f in HF_FILES):  # an imported Hugging Face tokenizer
        _copy(source, out, [f for f in source.iterdir() if f.is_file()])
        fast = AutoTokenizer.from_pretrained(str(out))
        return _special_ids(fast)
    elif arch == "gpt":  # no tokenizer (synthetic data): no ids rather than GPT-2's 50256
        return {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
    else:  # BERT's config default pad_token_id=0 is tpformer's [PAD]
        return {}
    fast.save_pretrained(str(out))
    return _special_ids(fast)


def _special_ids(fast: Any) -> dict[str, int | None]:
    size = len(fast)
    ids = {
        "pad_token_id": fast.pad_token_id,
        "bos_token_id": fast.bos_token_id,
        "eos_token_id": fast.eos_token_id,
    }
    return {k: v if isinstance(v, int) and 0 <= v < size else None for k, v in ids.items()}


def _copy(source: Path, out: Path, files: Sequence[Path]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for file in files:
        shutil.copy2(file, out / file.name)
