"""The console scripts, each on the one shell of `tpformer.cli.shell`:

tpformer-pretrain (pretrain.py), tpformer-finetune (finetune.py): Hydra entry points that train.
tpformer-plan (plan.py): which layout to use, from the planner's model (`tpformer.planner`).
tpformer-tokenizer, tpformer-preprocess (data.py): the data steps of a run, on their own.
tpformer-convert (convert.py): tpformer checkpoints <-> Hugging Face directories.

Nothing below this package imports it.
"""

from tpformer.startup import defer_full_collections, is_console_script

if is_console_script():  # before torch is imported: start-up without full collections
    defer_full_collections()
