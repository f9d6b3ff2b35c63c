"""fastscore: teacher-forced log-probabilities of an agent's action under many related chat contexts.

    import fastscore
    with fastscore.load() as s:                     # the embedded default model, llama.cpp f32
        result = s.score(messages, ["candidate A", "candidate B"])

Importing this package imports no backend: heavy libraries load when a model is loaded.
"""

from fastscore.api import OpenModel, Session, candidate_rows, load, to_frame
from fastscore.records import CandidateSetResult, GreedyResult, Message, ScoreResult
from fastscore.selection import ModelSelection
from fastscore.version import __version__

# Session: OpenModel's former name, kept as an alias.
__all__ = ["CandidateSetResult", "GreedyResult", "Message", "ModelSelection", "OpenModel", "ScoreResult", "Session",
           "__version__", "candidate_rows", "load", "to_frame"]
