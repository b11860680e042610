"""Alias of `tpformer-convert` (tpformer.cli.convert), for a checkout without the console scripts.

python tools/convert_checkpoint.py to-hf runs/bert/checkpoints/step00000300 hf/bert-mini
"""

from tpformer.cli.convert import main

if __name__ == "__main__":
    main()
