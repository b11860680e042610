#!/usr/bin/env bash
# The story of one run (examples/bert_pretrain/README.md): prepare the tokenizer and the corpus,
# pretrain bert_mini on Shakespeare at TP=2 on 2 local processes, stop half-way, resume, export
# the result to Hugging Face, fine-tune it. Run from the repository root after `pip install -e '.[demo]'`.
set -euo pipefail
RUN=${RUN:-runs/bert_mini_shakespeare}
STEPS=${STEPS:-1200}
OVERRIDES=(model=bert_mini model.vocab_size=4000 data.seq_length=64 trainer.micro_batch_size=32
           optim.lr=1e-3 optim.warmup_steps=100 "trainer.max_steps=$STEPS" trainer.eval_every=200
           "trainer.save_every=$((STEPS / 2))" parallel.tensor=2 launcher.nproc_per_node=2)

# 1. tokenizer (sentencepiece, 4000 tokens) and memory-mapped corpus, cached in ~/.cache/tpformer
tpformer-preprocess "${OVERRIDES[@]}"
# 2. pretrain the first half, saving a checkpoint at the stop
tpformer-pretrain "${OVERRIDES[@]}" "trainer.exit_at_step=$((STEPS / 2))" "hydra.run.dir=$RUN"
# 3. resume from the latest checkpoint (any layout would do: try parallel.tensor=1)
tpformer-pretrain "${OVERRIDES[@]}" trainer.resume=auto "hydra.run.dir=$RUN"
# 4. export to a Hugging Face directory (BertForPreTraining + the sentencepiece tokenizer)
tpformer-convert to-hf "$RUN/checkpoints/$(cat "$RUN/checkpoints/latest")" "$RUN/hf"
# 5. fine-tune the checkpoint on a GLUE-format task made from the plays (comedy or tragedy?)
python tools/make_genre_task.py --out "$RUN/glue_genre"
tpformer-finetune task=sst2 "init=$RUN/checkpoints/$(cat "$RUN/checkpoints/latest")" \
    "data.glue_dir=$RUN/glue_genre" data.max_length=64 optim.lr=1e-4 trainer.epochs=2 \
    parallel.tensor=2 launcher.nproc_per_node=2 "hydra.run.dir=$RUN/finetune"
echo "metrics: $RUN/metrics.jsonl  loss curve: $RUN/loss_curve.png  HF model: $RUN/hf  GLUE results: $RUN/finetune/results.json"
