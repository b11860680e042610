"""`tpformer-convert`: between tpformer checkpoints and Hugging Face directories.

tpformer-convert to-hf   runs/bert/checkpoints/step00000300  hf/bert-mini
tpformer-convert from-hf hf/bert-mini  runs/from-hf
tpformer-convert from-hf openai-community/gpt2@main runs/gpt2   # a Hugging Face Hub id
tpformer-pretrain trainer.resume=runs/from-hf/checkpoints/step00000000 ...   # continue it
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tpformer.cli.shell import console_script


@console_script
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="tpformer-convert",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "direction",
        choices=["to-hf", "from-hf"],
        help="to-hf: checkpoint -> save_pretrained directory; from-hf: the reverse",
    )
    parser.add_argument(
        "source",
        help="to-hf: a checkpoint directory (stepN); from-hf: a save_pretrained directory or a "
        "Hugging Face Hub id (name or org/name, @revision; through its cache, HF_HUB_OFFLINE)",
    )
    parser.add_argument("target", type=Path, help="the directory to write")
    args = parser.parse_args(argv)
    from tpformer.convert import from_hf, to_hf  # torch and transformers: after argument parsing

    convert = to_hf if args.direction == "to-hf" else from_hf
    source = args.source if args.direction == "from-hf" else Path(args.source)
    print(f"wrote {convert(source, args.target)}")


if __name__ == "__main__":
    main()
