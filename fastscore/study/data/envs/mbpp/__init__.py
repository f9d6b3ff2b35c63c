"""MBPP repair: model-written programs judged by running the tests in a sandbox, seeded single-edit mutants."""
