"""The regression task family (`family.RegressionFamily`), registered on import.

Classification with one float output: `task.RegressionTask` (squared error, correlations)
and `serving.RegressionServing` (a score per input) subclass classification's.
"""

from bert_trainer.tasks.plugins import register_family
from bert_trainer.tasks.regression.family import RegressionFamily

FAMILY = register_family(RegressionFamily())
