"""NAS-space sampling: a search space (YAML) -> architecture descriptions -> Graphs.

- `space`: a search-space file read and validated (`load_space`, `parse_space`);
- `draw`: architectures drawn from a space, deterministic in (space, seed, index) (`sample`);
- `build`: an architecture description -> its Graph (`build_graph`);
- `write`: samples written as .tflite plus architecture JSON (`write_samples`, `latpred sample`).

The names below are the stage's interface (docs name `sampler.build_graph` and
`sampler.make_divisible`); import them from here, not from the modules.
"""

from latpred.sampler.build import build_graph, model_id
from latpred.sampler.draw import make_divisible, sample, sample_one
from latpred.sampler.space import SearchSpace, Stage, load_space, parse_space
from latpred.sampler.write import write_samples

__all__ = ["SearchSpace", "Stage", "build_graph", "load_space", "make_divisible", "model_id",
           "parse_space", "sample", "sample_one", "write_samples"]
