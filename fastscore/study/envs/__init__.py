"""Study environments, one subpackage each; the runner reaches them only through the environment contract."""
