"""Convert between tpformer checkpoints and Hugging Face directories.

    python tools/convert_checkpoint.py to-hf   runs/bert/checkpoints/step00000300  hf/bert-mini
    python tools/convert_checkpoint.py from-hf hf/bert-mini  runs/from-hf
    tpformer-pretrain trainer.resume=runs/from-hf/checkpoints/step00000000 ...   # continue it
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tpformer.convert import from_hf, to_hf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("direction", choices=["to-hf", "from-hf"])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args()
    if args.direction == "to-hf":
        print(f"wrote {to_hf(args.source, args.target)}")
    else:
        print(f"wrote {from_hf(args.source, args.target)}")


if __name__ == "__main__":
    main()
