"""`bert-train finetune`: not built yet (see the open issues)."""

from bert_trainer.errors import UserError


def main(argv):
    del argv
    raise UserError("'finetune' is not implemented yet in this version of bert-train")
