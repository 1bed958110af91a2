"""allocsim's version, the one place it is written (pyproject.toml reads it): ``allocsim --version`` prints it."""

__version__ = "0.1.0"
