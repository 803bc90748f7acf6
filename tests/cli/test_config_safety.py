"""Configs are data: a .gin file or --gin_param binds and references only registered
configurables; `import`, dynamic registration and unregistered callables are refused with one
line before gin binds or imports anything."""

import os

import gin
import pytest

from bert_trainer import configurables
from bert_trainer.errors import UserError
from bert_trainer.runs import gin_config

EVIL = ("from __gin__ import dynamic_registration\nimport os\n"
        "TrainerConfig.train_steps = @os.system()\nos.system.command = 'touch {marker}'\n")


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "ran"
    yield path
    assert not path.exists(), "a config ran a shell command"


def test_a_gin_file_that_imports_code_is_refused_before_it_runs(tmp_path, marker):
    evil = tmp_path / "evil.gin"
    evil.write_text(EVIL.format(marker=marker))
    with pytest.raises(UserError) as raised:
        gin_config.parse_gin([str(evil)])
    assert str(raised.value) == (f"{evil}:1: 'from __gin__ import dynamic_registration' is "
                                 "refused: a config may not import code (configs are data); "
                                 "remove the line, and name a plugin task family with "
                                 "--family_module instead")
    assert gin.config_str().strip() == "" or "os.system" not in gin.config_str()


def test_an_included_file_and_a_gin_param_are_checked_too(tmp_path, marker):
    (tmp_path / "imports_os.gin").write_text(EVIL.format(marker=marker).split("\n", 1)[1])
    outer = tmp_path / "outer.gin"
    outer.write_text("include 'configs/smoke.gin'\ninclude 'imports_os.gin'\n")
    with pytest.raises(UserError, match=r"imports_os.gin:1: 'import os' is refused"):
        gin_config.parse_gin([str(outer)])
    gin.clear_config()
    with pytest.raises(UserError, match=r"^--gin_param 'import os':1: 'import os' is refused"):
        gin_config.parse_gin(["configs/smoke.gin"], ["import os"])
    # An earlier good file is not bound either: everything is checked first.
    assert not gin_config.gin_is_bound("TrainerConfig.train_steps")


def test_a_reference_to_an_unregistered_callable_is_refused(tmp_path, marker):
    binding = "TrainerConfig.train_steps = @os.system()"
    with pytest.raises(UserError) as raised:
        gin_config.parse_gin(["configs/smoke.gin"], [binding])
    message = str(raised.value)
    assert message.startswith(f"--gin_param {binding!r}:1: '@os.system' is not a registered "
                              "configurable; a config may reference only bert-train's (")
    assert "build_encoder" in message and "\n" not in message
    with pytest.raises(UserError, match=r"'@os.system' is not a registered configurable"):
        configurables.encoder_from_gin("configs/encoders/tiny.gin", [binding])


def test_registered_references_macros_and_includes_still_work(tmp_path):
    good = tmp_path / "good.gin"
    good.write_text("include 'configs/smoke.gin'\nSTEPS = 7\nTrainerConfig.train_steps = %STEPS\n"
                    "scoped/build_encoder.num_layers = 1\n")
    gin_config.parse_gin([str(good)], ["TrainerConfig.train_steps = 9"])
    assert gin.query_parameter("TrainerConfig.train_steps") == 9
    assert os.path.isfile(gin_config.resolve_gin_file("configs/smoke.gin"))
