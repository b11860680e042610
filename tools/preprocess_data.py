"""Tokenize a corpus into the memory-mapped files a pretraining run reads (cached by content hash).

python tools/preprocess_data.py data=jsonl data.paths=[big.jsonl] model.vocab_size=30522 \
    data.workers=8
"""

from tpformer.cli.data import preprocess_main

if __name__ == "__main__":
    preprocess_main()
