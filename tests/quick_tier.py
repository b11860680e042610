"""The quick tier's time rule: a test over QUICK_LIMIT_S goes to the full run alone.

Measured in the quick tier itself (2026-12-01, `python -m pytest tests -m "not slow"` on the 2-core
development machine, 920 tests in 7.1 min): the tests below took QUICK_LIMIT_S or more each, 225 s
of the tier's 762 s summed; they keep their place in the full suite, which CI runs. Left in the
quick tier on purpose: the first case of each sweep (the inner loop meets every sweep once) and
the cases of the bad-input tables (tests/cli/in_process.py: the first case of a table pays for
the whole table). `tests/budget.py` marks these `slow` at collection; `tests/test_budget.py`
fails on a name whose file or test function is gone, so the list cannot rot unseen (a renamed
parameter case alone would only return to the quick tier)."""

from __future__ import annotations

import pytest

QUICK_LIMIT_S = 2.5
OVER_THE_LIMIT = frozenset(
    {
        "tests/cli/test_help.py::test_groups_show_only_the_options_the_command_takes",
        "tests/cli/test_help.py::test_help_shows_the_values_the_run_would_take",
        "tests/config/test_config.py::test_public_key_set_is_deliberate",
        "tests/data/test_glue.py::test_metrics_match_hand_computed_values",
        "tests/data/test_recipe_statistics.py::test_masked_share_and_80_10_10_match_the_transformers_collator",
        "tests/data/test_steps.py::test_a_dead_worker_ends_the_run_instead_of_hanging",
        "tests/data/test_steps.py::test_a_loader_left_open_does_not_hold_the_process_at_exit",
        "tests/engine/test_fp8.py::test_tp2_scales_as_one_process_and_not_without_the_amax_reduction[False]",
        "tests/engine/test_fp8.py::test_tp2_scales_as_one_process_and_not_without_the_amax_reduction[True]",
        "tests/engine/test_recompute.py::test_checkpointing_saves_the_activation_memory_it_promises",
        "tests/engine/test_recompute.py::test_gradients_are_bitwise_equal_with_dropout[2-fast]",
        "tests/engine/test_recompute.py::test_zero3_with_checkpointing_is_bitwise_equal",
        "tests/engine/test_zero.py::test_lamb_matches_per_parameter_reference[1-4]",
        "tests/engine/test_zero.py::test_lamb_matches_per_parameter_reference[2-2]",
        "tests/engine/test_zero.py::test_small_buckets_hold_less_whole_gradient",
        "tests/engine/test_zero.py::test_small_buckets_match_single_process_adamw[1-2]",
        "tests/engine/test_zero.py::test_whole_gradients_are_freed_as_they_are_reduced[2]",
        "tests/engine/test_zero.py::test_whole_gradients_are_freed_as_they_are_reduced[4]",
        "tests/inference/test_generation.py::test_cached_decoding_equals_the_full_sequence_at_every_step",
        "tests/inference/test_generation.py::test_greedy_and_sampled_tokens_are_the_same_at_every_tp_degree[2]",
        "tests/inference/test_generation.py::test_greedy_and_sampled_tokens_are_the_same_at_every_tp_degree[4]",
        "tests/layers/test_linear.py::test_row_parallel_matches_linear[True-4]",
        "tests/models/test_bert.py::test_dropout_is_bitwise_reproducible_and_active",
        "tests/models/test_bert.py::test_tp_matches_single_process[4-0.0-gpt]",
        "tests/models/test_bert.py::test_tp_matches_single_process[4-0.0-modernbert]",
        "tests/models/test_bert.py::test_tp_matches_single_process[4-0.0-multi_query]",
        "tests/models/test_bert.py::test_tp_matches_single_process[4-0.2-modernbert]",
        "tests/models/test_context_parallel.py::test_model_at_cp2_sums_to_the_single_process_step[classification-0.2-2]",
        "tests/models/test_context_parallel.py::test_model_at_cp2_sums_to_the_single_process_step[llama-0.2-2]",
        "tests/models/test_context_parallel.py::test_model_at_cp2_sums_to_the_single_process_step[modernbert_global_cls-0.2-2]",
        "tests/models/test_hf.py::test_pretrained_minilm_at_tp2_matches_transformers",
        "tests/models/test_llama.py::test_greedy_tokens_equal_transformers_generate_at_tp1_and_tp2",
        "tests/models/test_sequence_parallel.py::test_layer_matches_single_process_and_moves_tp_bytes[2-0.0-True]",
        "tests/models/test_sequence_parallel.py::test_layer_matches_single_process_and_moves_tp_bytes[4-0.0-False]",
        "tests/models/test_sequence_parallel.py::test_layer_matches_single_process_and_moves_tp_bytes[4-0.0-True]",
        "tests/models/test_sequence_parallel.py::test_layer_matches_single_process_and_moves_tp_bytes[4-0.2-False]",
        "tests/models/test_sequence_parallel.py::test_layer_matches_single_process_and_moves_tp_bytes[4-0.2-True]",
        "tests/models/test_sequence_parallel.py::test_model_matches_single_process[4-0.2-classification]",
        "tests/parallel/test_context.py::test_context_parallel_groups_sit_between_dp_and_tp[4-2-2]",
        "tests/parallel/test_random.py::test_initialization_is_bitwise_layout_independent[4]",
        "tests/pipeline/test_pipedream.py::test_pipedream_under_fast_equals_its_staleness_reference[4]",
        "tests/pipeline/test_pipedream.py::test_step_updates_without_staleness_in_the_first_step",
        "tests/pipeline/test_pipeline_training.py::test_pipeline_with_tp_sequence_parallel_and_explicit_split[extra0]",
        "tests/pipeline/test_pipeline_training.py::test_pipeline_with_tp_sequence_parallel_and_explicit_split[extra1]",
        "tests/planner/test_plan_cli.py::test_confirmation_runs_cover_distinct_splits",
        "tests/train/test_context_parallel.py::test_fine_tuning_pads_batches_to_the_context_multiple",
        "tests/train/test_context_parallel.py::test_saved_activations_and_ring_bytes_match_the_formulas[4]",
        "tests/train/test_fast_invariance.py::test_fast_mode_finetuning_layout_gives_the_one_process_run[parallel0]",
        "tests/train/test_fast_invariance.py::test_fast_mode_resume_on_a_smaller_world_gives_the_uninterrupted_losses",
        "tests/train/test_fast_invariance.py::test_fast_mode_stop_and_resume_gives_the_uninterrupted_losses[1-parallel0]",
        "tests/train/test_finetune.py::test_recomputation_gives_the_same_dev_predictions[full]",
        "tests/train/test_finetune.py::test_stopped_and_resumed_finetuning_gives_the_uninterrupted_metrics",
        "tests/train/test_host_syncs.py::test_a_step_reads_nothing_from_the_device_tp2_dp2",
        "tests/train/test_input_pipeline.py::test_stop_and_resume_with_workers_equals_the_uninterrupted_run",
        "tests/train/test_loggers.py::test_wandb_gets_the_tensorboard_scalars_and_the_config",
        "tests/train/test_plan.py::test_activation_estimate_matches_saved_tensors[4-False-selective]",
        "tests/train/test_trainer.py::test_typo_fails_before_any_process",
    }
)
"""Node ids, as pytest prints them from the repository root."""


def mark_over_the_limit(items: list[pytest.Item]) -> None:
    """Mark the tests over the quick tier's limit `slow` (tests/test_budget.py holds the names
    to tests that exist)."""
    for item in items:
        if item.nodeid in OVER_THE_LIMIT:
            item.add_marker(pytest.mark.slow)
