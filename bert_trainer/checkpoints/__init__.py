"""Checkpoints: what a model is on disk, how its variables are named, and how a run resumes.

    layout.py          stable variable names (`model/encoder/...`) and reading either naming back
    model_dir.py       the bert-train model directory: bert_train.json, vocab.txt, ckpt-N,
                       warm starts
    multi_seed_dir.py  a multi-seed run's MODEL_DIR/multi_seed.json and seed-N directories
    select.py          which checkpoint to read (latest, best, a step, a prefix) and whether it
                       is whole; one function for evaluate, export, predict and warm starts
    resume.py          restoring a run's newest whole checkpoint, architecture checks
    best.py            the best checkpoint by an eval metric, kept in model_dir/best/
    storage.py         writes of checkpoints and run files that fail cleanly (no partial files)
    leftovers.py       what a killed run left (ckpt-N_temp/, .NAME.tmp-PID), removed on the next
                       run's start

Reading a checkpoint of any format (bert-train, Hugging Face, Google TF1) for a warm start is
`bert_trainer.interop.resolve.resolve_checkpoint`, which builds on these modules.
"""
