"""`bert-train create_pretraining_data`: not built yet (see the open issues)."""

from bert_trainer.errors import UserError


def main(argv):
    del argv
    raise UserError("'create_pretraining_data' is not implemented yet in this version of bert-train")
