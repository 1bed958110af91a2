"""allocsim's version (also in pyproject.toml): ``allocsim --version`` prints it."""

__version__ = "0.1.0"
