"""fastscore: teacher-forced log-probabilities of an agent's action under many related chat contexts.

Importing this package imports no backend: heavy libraries load when a backend is chosen.
"""

__version__ = "0.1.0"
