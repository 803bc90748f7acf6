"""`bert-train predict`: not built yet (see the open issues)."""

from bert_trainer.errors import UserError


def main(argv):
    del argv
    raise UserError("'predict' is not implemented yet in this version of bert-train")
