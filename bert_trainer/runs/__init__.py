"""Run builders: a pretraining or fine-tuning run built from its settings in one place.

`runs.pretraining.build_pretraining_run` and `runs.finetuning.build_finetuning_run` return a
`runs.run.Run` (its task and `Trainer`) that `bert-train pretrain` and `finetune` start, and that
the benchmarks and tests drive. `runs.gin_config` parses the gin config a run reads. The commands
read flags into the settings, call these and print.
"""
