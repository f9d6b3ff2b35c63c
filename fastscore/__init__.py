"""fastscore: teacher-forced log-probabilities of an agent's action under many related chat contexts.

    import fastscore
    with fastscore.load() as s:                     # the embedded default model, llama.cpp f32
        result = s.score(messages, ["candidate A", "candidate B"])

Importing this package imports no backend: heavy libraries load when a model is loaded.
"""

__version__ = "0.1.0"

from fastscore.api import Session, candidate_rows, load, to_frame  # noqa: E402
from fastscore.records import CandidateSetResult, GreedyResult, Message, ScoreResult  # noqa: E402

__all__ = ["CandidateSetResult", "GreedyResult", "Message", "ScoreResult", "Session", "__version__",
           "candidate_rows", "load", "to_frame"]
