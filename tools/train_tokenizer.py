"""Train the sentencepiece tokenizer of a corpus: same overrides as tpformer-pretrain.

python tools/train_tokenizer.py data=text data.paths=[corpus.txt] model.vocab_size=8000 --out tok/
"""

from tpformer.cli.data import train_tokenizer_main

if __name__ == "__main__":
    train_tokenizer_main()
