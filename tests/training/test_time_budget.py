"""A run bounded by wall-clock time (TrainerConfig.time_budget, training/time_budget.py): it
ends near its budget with the learning rate through warmup and down to ~0, records what the
budget bought, and a resume continues the budget; durations are parsed or refused in one line."""


import pytest
from summary_testing import read_scalars
from toy_task import ToyTask

from bert_trainer import durations
from bert_trainer.errors import UserError
from bert_trainer.training import optimization, time_budget
from bert_trainer.training.optimization import OptimizerConfig
from bert_trainer.training.trainer import Trainer, TrainerConfig

BUDGET = 4.0


def make(model_dir, optimizer, **config):
    config = {"train_steps": 100, "steps_per_loop": 20, "summary_interval": 2,
              "eval_steps": 0, "checkpoint_interval": 100_000, "time_budget": BUDGET, **config}
    return Trainer(ToyTask(), str(model_dir), config=TrainerConfig(**config), optimizer=optimizer)


def traced(trainer):
    """`trainer`, its loop traced (no step runs): on a busy machine tracing takes seconds,
    which a budget counts, and would leave these seconds-long budgets little to measure."""
    trainer.run_steps(trainer.train_iterator(), 0)
    return trainer


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("20m", 1200), ("1.5h", 5400),
                                           ("45", 45), (" 2m ", 120), (30, 30), (0.5, 0.5)])
def test_durations_parse(text, seconds):
    assert durations.parse_duration(text) == seconds
    assert durations.parse_duration(durations.format_duration(seconds)) == seconds
    assert TrainerConfig(train_steps=1, time_budget=text).time_budget == seconds


@pytest.mark.parametrize("bad", ["20 minutes", "-5m", "0", "1e3s", "m", "", "inf", True, [1]])
def test_a_bad_duration_is_refused_in_one_line(bad):
    with pytest.raises(UserError) as caught:
        TrainerConfig(train_steps=1, time_budget=bad)
    message = str(caught.value)
    assert message == (f"time_budget={bad!r} is not a duration > 0; give seconds or a number "
                       "and a unit, e.g. 90s, 20m or 1.5h")


@pytest.mark.parametrize("schedule", ["bert", "one_cycle"])
def test_the_schedule_runs_on_the_fraction_of_the_budget(schedule, monkeypatch):
    """fraction * train_steps is the step schedule's step: the same rates, at any speed."""
    config = OptimizerConfig(learning_rate=1e-2, warmup_fraction=0.2, schedule=schedule)
    clock = time_budget.BudgetClock(10.0)
    budget = optimization.build_schedule(config, 50, clock)
    steps = optimization.build_schedule(config, 50)
    # A clock that does not move while the loop is planned: on a loaded machine the planning's
    # two readings of the time drifted apart and the per-step share with them.
    monkeypatch.setattr(time_budget.time, "perf_counter", lambda: 1000.0)
    clock._started, clock._base = 1000.0, 0.0
    clock._seconds_per_step = 0.5  # 20 steps of the budget: one step is 2.5 planned steps
    clock.plan_loop(step=0, iteration=0, max_steps=100)
    for iteration in (0, 3, 4, 10, 19, 20, 30):
        fraction = min(clock._start_fraction.numpy() + iteration * 0.05, 1.0)
        assert float(budget(iteration)) == pytest.approx(float(steps(fraction * 50)), rel=1e-5)
    assert float(budget(30)) == 0.0  # past the budget: the schedule's end


@pytest.mark.slow
def test_a_budget_run_ends_near_its_budget_with_the_rate_through_warmup_to_zero(tmp_path):
    optimizer = OptimizerConfig(learning_rate=1e-2, warmup_fraction=0.5, schedule="one_cycle")
    trainer = traced(make(tmp_path, optimizer, time_budget=6.0))
    result = trainer.train_and_evaluate()
    record = result.time_budget
    assert record["seconds"] == 6.0 and record["steps"] == result.step > 20
    # The loop stops within about one step of the budget (steps take milliseconds here); the
    # final checkpoint and summaries follow it.
    assert 5.9 <= record["elapsed_seconds"] <= 6.5
    rates = read_scalars(tmp_path / "train")["learning_rate"]
    fractions = read_scalars(tmp_path / "train")["time_budget_fraction"]
    steps = sorted(rates)
    peak_step = max(steps, key=rates.get)
    assert rates[steps[0]] < 0.3 * rates[peak_step]  # warmup from ~0...
    assert rates[peak_step] > 0.8e-2  # ...to the peak (sampled every other step)...
    assert 0.4 < fractions[peak_step] < 0.6  # ...at half the budget, not of train_steps
    warmup = [rates[step] for step in steps if step <= peak_step]
    assert warmup == sorted(warmup)
    # ~0 at the end: the last step's rate is the decay's (2 x peak x the fraction left) a step
    # or two before the budget's end, a step being about 1 / result.step of it (the summaries
    # between loops take time too).
    assert rates[steps[-1]] <= 8.0 * rates[peak_step] / result.step
    assert fractions[steps[-1]] > 0.97
    assert result.step != 100  # train_steps did not stop it
    info = tmp_path / "bert_train.json"
    assert not info.exists()  # the toy task writes none: nothing is added


@pytest.mark.slow
def test_a_resumed_budget_run_continues_its_budget(tmp_path):
    optimizer = OptimizerConfig(learning_rate=1e-2, warmup_fraction=0.3)
    first = traced(make(tmp_path, optimizer, time_budget=2.0))
    done = first.train_and_evaluate()
    assert 1.9 <= done.time_budget["elapsed_seconds"] <= 2.5
    # A second run with a larger budget resumes the step and the seconds already spent.
    again = traced(make(tmp_path, optimizer, time_budget=BUDGET))
    assert int(again.global_step.numpy()) == done.step
    result = again.train_and_evaluate()
    assert result.step > done.step
    assert BUDGET - 0.1 <= result.time_budget["elapsed_seconds"] <= BUDGET + 0.5
    assert result.time_budget["steps_this_process"] == result.step - done.step
    # Its first step was taken half-way through the budget, not at its start.
    fractions = read_scalars(tmp_path / "train")["time_budget_fraction"]
    assert fractions[min(step for step in fractions if step > done.step)] >= 0.5
    # A finished budget started again trains no step.
    final = make(tmp_path, optimizer, time_budget=BUDGET).train_and_evaluate()
    assert final.step == result.step


def test_a_budget_is_refused_with_several_workers(tmp_path, monkeypatch):
    from bert_trainer.training import preemption  # noqa: PLC0415

    monkeypatch.setattr(preemption, "is_multi_worker", lambda strategy: True)
    with pytest.raises(UserError, match="time_budget is not supported with several workers"):
        make(tmp_path, OptimizerConfig())


@pytest.mark.slow
def test_a_budget_run_and_a_run_of_steps_do_not_resume_each_other(tmp_path):
    optimizer = OptimizerConfig(learning_rate=1e-2)
    done = make(tmp_path / "budget", optimizer, time_budget=0.5).train_and_evaluate()
    # A trainer without a budget (an evaluation's) restores the run; it does not train on.
    steps = make(tmp_path / "budget", optimizer, time_budget=None)
    assert int(steps.global_step.numpy()) == done.step
    with pytest.raises(UserError, match=r"^model_dir .*budget holds a time-budget run \(.*"
                                        r"ckpt-\d+\); resume it with --time_budget"):
        steps.train_and_evaluate()
    make(tmp_path / "steps", optimizer, time_budget=None, train_steps=2).train_and_evaluate()
    with pytest.raises(UserError, match=r"^model_dir .*steps holds a run of steps without a "
                                        r"time budget \(.*ckpt-2\); resume it without"):
        make(tmp_path / "steps", optimizer)
